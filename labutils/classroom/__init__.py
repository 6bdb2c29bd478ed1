"""What an instructor runs for a class: ``release`` (student editions), ``grade`` (autograding into a
gradebook), ``check`` (every learner's GPU slice on a shared node). See INSTRUCTORS.md."""
