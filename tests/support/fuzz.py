"""Generated hostile ``%%ddp`` lines, seeded (``NBDDP_FUZZ_SEED`` picks another seed): options and
values in any order, quoted or not, sometimes with a broken quote or ``--``. The pure rules take
them in tests/unit/test_fuzz_input.py, the real magics a sample in tests/kernel/test_fuzz_magics.py."""
from __future__ import annotations

import os
import random
import shlex

from nbddp.core import ddpline

SEED = int(os.environ.get("NBDDP_FUZZ_SEED", "37"))
FLAGS = sorted({s for a in ddpline.build_parser()._actions for s in a.option_strings})
VALUES = [
    "", " ", "0", "-1", "1", "2", "4", "99999999999", "1e999", "-1e999", "nan", "inf", "1.5", "0x10", "1_0",
    "\u0663", "\x00", "\udc80", "\ud800", "a" * 300, "a" * 64 + ".b", "\u00e9.fr", "~", "~/x", "/", "/etc/passwd",
    "/etc/passwd/x", "/proc/1/x", "..", "-", "--", "-n", "=", "a=b", "A=1", "PATH=x", "RANK=1", "'", '"', "\\",
    "$(id)", "`id`", ";", "\n", "\t", "0,1", ",", "1,,2", "-0", "+5", "  3 ", "[::1]", "::1", "localhost:29500",
    "host:99999", "x.py", "y.sbatch", "auto", "gloo", "nccl", "merge", "apart", "torchrun", "slurm", "local",
    "text", "widgets", "spawn", "dash", "underscore", "--qos=high", "#SBATCH -N 1", "01:00:00", "unlimited",
    "x@1", "x@99999999999999999999", "True", "None", "9" * 5000, "1e5000", "a,b", "1-2:3", "0.000001", "1e-320",
    "65536", "29500",
]


def _word(rng: random.Random) -> str:
    return rng.choice(VALUES) if rng.random() < 0.8 else "".join(
        chr(rng.choice([rng.randrange(32, 127), rng.randrange(0, 0x110000)])) for _ in range(rng.randrange(1, 12)))


def random_line(rng: random.Random) -> str:
    """Options and values in any order, quoted or not, sometimes with a broken quote or ``--``."""
    words = []
    for _ in range(rng.randrange(0, 7)):
        flag = rng.choice(FLAGS)
        if rng.random() < 0.3:
            words.append(f"{flag}={shlex.quote(_word(rng))}")
            continue
        words.append(flag)
        if rng.random() < 0.85:
            words.append(shlex.quote(_word(rng)) if rng.random() < 0.7 else _word(rng))
    if rng.random() < 0.1:
        words += ["--"] + [shlex.quote(_word(rng)) for _ in range(rng.randrange(0, 3))]
    rng.shuffle(words) if rng.random() < 0.2 else None
    return " ".join(words)
