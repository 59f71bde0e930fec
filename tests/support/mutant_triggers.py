"""The mutants only the shipped model's kernel-gate examples reach (the kernel gate's tests run them there; the mutant
catalogue's tests leave them to it)."""

# Each new mutant, and the example that alone catches it on the CPU (a substring of the failing checks' names) or
# the check kind that does.
TRIGGERS = {
    "norm-wide-padded-mean": "c=5376",
    "residual-wide-chunk-gate": "c=5376",
    "kv-heads-modulo-two": "heads=",
    "qk-norm-heads-tile-two": "heads=56",
    "softmax-without-max": "aligned=True",
    "norm-unmodulated-without-autograd": "mode=",
    "residual-in-place-without-autograd": "mode=",
    "kv-read-with-q-strides": "layout=independent",
    "residual-y-read-with-residual-strides": "layout=independent",
}
