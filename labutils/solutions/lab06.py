"""Reference solutions for lab 06 (capstone)."""


def min_size_for_fraction(fit, fraction):
    """Smallest message S (bytes) whose bandwidth S / t(S) reaches ``fraction`` of beta.

    From t = alpha + S / beta: S / t = f beta  <=>  S = f / (1 - f) * alpha * beta
    (f = 1/2 gives n_1/2 = alpha beta, Hockney's half-performance length).
    """
    return fraction / (1.0 - fraction) * (fit.alpha_us * 1e-6) * (fit.beta_gbps * 1e9)


def predict_step_comm_ms(fits, ops):
    """Communication time of one training step (ms) predicted from alpha-beta fits alone:
    sum over the step's ops of count_per_step x (alpha + S / beta) of that op's collective."""
    return sum(op["count_per_step"] * fits[op["op"]].predict_ms(op["size_bytes"]) for op in ops)
