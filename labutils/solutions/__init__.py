"""Reference solutions of the labs' exercises (one module per lab). Peek only after trying!"""
