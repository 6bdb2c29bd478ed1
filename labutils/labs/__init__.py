"""Each lab's helpers, one package a lab: ``labNN_topic/`` with modules named for what they are
(``measure``, ``verify``, ``model``, ``claims`` ...). What a lab *teaches* is code in its notebook;
these packages hold the harness around it: workloads, measurement sweeps, verdicts, recordings."""
