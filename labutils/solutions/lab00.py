"""Reference solutions for lab 00."""


def predicted_time_ms(size_bytes, alpha_us, beta_gbps):
    """t(S) = alpha + S / beta, in ms (alpha in us, beta in GB/s = 1e9 B/s)."""
    return alpha_us * 1e-3 + size_bytes / (beta_gbps * 1e9) * 1e3
