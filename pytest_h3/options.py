"""Every pytest-h3 command-line option, named once: the constants below are the only place an option's name is
written in the plugin, and :func:`add_options` the only place pytest is told how to parse and document it."""

from h3gate.evidence.profiles import PROFILES, described  # imports nothing heavy

MODEL = "--h3-model"
CANDIDATE = "--h3-candidate"
DEVICE = "--h3-device"
OUT = "--h3-out"
THRESHOLDS = "--h3-thresholds"
FREEZE_FORCE = "--h3-freeze-force"
FREEZE = "--h3-freeze"
VARIANTS = "--h3-variants"
VERIFY_LAST_STEP = "--h3-verify-last-step"
SKIP_MODEL_GATE = "--h3-skip-model-gate"
KERNEL_EXAMPLES = "--h3-kernel-examples"
MODEL_SEED = "--h3-model-seed"
SIGN_KEY = "--h3-sign-key"
PROFILE = "--h3-profile"
WORKERS_PER_GPU = "--h3-workers-per-gpu"
SHARD = "--h3-shard"


def add_options(parser) -> None:
    """Every option in pytest's ``h3`` group (``pytest --help`` lists them)."""
    group = parser.getgroup("h3", "pytest-h3: qualification of MiniMax-H3 kernel candidates")
    group.addoption(
        MODEL,
        default="tiny",
        help="model to qualify on: 'tiny' (embedded, CPU-sized), 'edge' (embedded: tiny at the kernels' edges, for the "
        "model and block gates), 'small' (embedded, benchmark-sized), 'release' (the "
        "release-size transformer with random weights, built on a CUDA GPU; H3GATE_LAYERS=N builds its first N blocks "
        "as the partial model release-layers<N>) or the path of a local diffusers MiniMax-H3 checkpoint folder "
        "(default: tiny)",
    )
    group.addoption(
        CANDIDATE,
        default="h3_triton",
        help="candidate to qualify, from the h3gate.candidates entry points: 'h3_triton' (default), 'provider' "
        "(the self-check) or any installed one; options as name:key=value,key=value",
    )
    group.addoption(
        DEVICE,
        default="auto",
        help="device to run on: 'cpu', 'cuda', 'cuda:N' or 'auto' (cuda when a GPU is visible, else cpu; on cpu the "
        "Triton kernels run under TRITON_INTERPRET=1)",
    )
    group.addoption(OUT, default="h3-out", help="folder for results, artifacts and evidence (default: h3-out)")
    group.addoption(
        THRESHOLDS,
        default=None,
        help="folder of frozen bounds and contracts with its LOCK.json (default: <rootdir>/thresholds)",
    )
    group.addoption(
        FREEZE,
        action="store_true",
        help="freeze bounds instead of checking a candidate: run the provider variants only (never the candidate) "
        f"and write bounds under {THRESHOLDS}; refuses under xdist and refuses to overwrite existing bounds",
    )
    group.addoption(
        FREEZE_FORCE,
        metavar="REASON",
        default=None,
        help=f"with {FREEZE}: overwrite existing bounds; REASON is recorded in the bounds file",
    )
    group.addoption(
        VARIANTS,
        default=None,
        help=f"with {FREEZE}: comma-separated provider variants to calibrate from (default: every variant of the "
        "device; 'h3gate variants' lists them)",
    )
    group.addoption(
        VERIFY_LAST_STEP,
        action="store_true",
        help="generation gate: on resume, recompute the last saved step and require it bitwise equal (catches a "
        "non-deterministic candidate)",
    )
    group.addoption(
        SKIP_MODEL_GATE,
        metavar="REASON",
        default=None,
        help="generation gate: run without a passed model gate for this candidate; REASON is recorded in the "
        "results and the evidence",
    )
    group.addoption(
        KERNEL_EXAMPLES,
        type=int,
        default=8,
        help="kernel gate: shapes hypothesis draws per op and dtype (default: 8; failures are shrunk to a minimal shape)",
    )
    group.addoption(MODEL_SEED, type=int, default=0, help="weight seed of an embedded model (default: 0)")
    group.addoption(
        SIGN_KEY,
        metavar="PEM",
        default=None,
        help="Ed25519 private key (PEM file) that signs the evidence; without it the key comes from the "
        "H3GATE_SIGN_KEY environment variable (PEM text), and without that the evidence is written UNSIGNED "
        "(h3gate keygen DIR makes a key pair)",
    )
    group.addoption(
        PROFILE,
        default="ci",
        choices=tuple(PROFILES),
        help="completeness profile of the evidence: the gates a run must contain to be PASSED rather than "
        f"INCOMPLETE ({described()}; default: ci)",
    )
    group.addoption(
        WORKERS_PER_GPU,
        type=int,
        default=1,
        metavar="K",
        help="with xdist: K workers share each GPU (-n auto starts K per GPU); worth it for the kernel gate, "
        "whose time goes to compiling kernels on the host (default: 1)",
    )
    group.addoption(
        SHARD,
        metavar="I/N",
        default=None,
        help="run the I-th of N deterministic shares of the gate items (e.g. one per Slurm array task); join "
        "the shards' evidence with 'h3gate merge'",
    )


def dest(option: str) -> str:
    """The attribute an option's value has on pytest's argument namespace (``--h3-device`` -> ``h3_device``)."""
    return option.removeprefix("--").replace("-", "_")
