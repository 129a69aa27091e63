"""Regenerate ``tests/data/java_hashes.json`` with the machine's Java.

    cd /work/main && .venv/bin/python tests/java/regen_java_hashes.py

Needs ``javac`` and ``java`` (17 or later) on PATH.  It compiles
``tests/java/JavaHash.java`` into a temporary directory, feeds it a fixed set
of keys, prints what it wrote, and overwrites the data file.  The values in
the file come only from Java: nothing here hashes in Python, so the file is an
independent reference for both router twins (``tests/test_java_parity.py``).

Keys travel to Java, and are stored in the file, as base64 of their UTF-16LE
code units (``utf16le_b64``), which keeps lone surrogates, NUL and newlines
intact.  The file also carries each key as a JSON string (``key``, ASCII-
escaped; Python's ``json`` round-trips lone surrogates as ``\\udXXX``) so a
human can read it; the tests check that the two agree.

The functions here are also used by ``tests/test_java_parity.py`` to run Java
live on fresh random keys.
"""

from __future__ import annotations

import base64
import json
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
JAVA_SOURCE = HERE / "JavaHash.java"
DATA_FILE = HERE.parent / "data" / "java_hashes.json"

#: The moduli JavaHash.java prints floorMod for, in its order (it says so in
#: its header line, which ``run_java`` checks against this).
MODULI = (1, 2, 3, 7, 8, 16, 64, 1000, 1024)
#: Seed of the random keys stored in the data file.
DATA_SEED = 20240607
#: How many random keys the data file holds.
DATA_RANDOM_KEYS = 300

# --- keys ------------------------------------------------------------------------


def fixed_keys() -> list[tuple[str, str]]:
    """``(name, key)`` pairs chosen by hand: each names what it covers."""
    return [
        ("empty", ""),
        ("ascii a", "a"),
        ("ascii hello", "hello"),
        ("collision Aa", "Aa"),
        ("collision BB", "BB"),
        ("Integer.MIN_VALUE polygenelubricants", "polygenelubricants"),
        ("order id", "order-000042"),
        ("account 16 digits", "6222021234567890"),
        ("account 16 digits 2", "4111111111111111"),
        ("account zeros", "0000000000000000"),
        ("account nines", "9999999999999999"),
        ("account 19 digits", "6212261202011584365"),
        ("cjk 你好世界", "\u4f60\u597d\u4e16\u754c"),
        ("cjk 订单-12345", "\u8ba2\u5355-12345"),
        ("astral 🚀rocket😀", "\U0001f680rocket\U0001f600"),
        ("astral 👍", "\U0001f44d"),
        ("astral U+20000", "\U00020000"),
        ("astral U+10FFFF", "\U0010ffff"),
        ("lone high surrogate", "\ud800"),
        ("lone low surrogate", "\udfff"),
        ("lone surrogates in text", "a\udc00b\ud83dc"),
        ("reversed pair", "\ude00\ud83d"),
        ("lone surrogate with astral", "\ud800\U0001f600"),
        ("latin-1 café", "caf\u00e9"),
        ("latin-1 ÿ", "\u00ff\u00ff"),
        ("bmp U+FFFF", "\uffff"),
        ("nul", "\x00"),
        ("newlines", "a\nb\r\nc"),
        ("1000 chars", ("abc" * 334)[:1000]),
        ("1000 chars mixed", ("x\u00e9\u4e2d\U0001f600" * 250)),
    ]


# Code point ranges a random key draws from; a key uses one to three of
# them, so every PEP 393 width (1-, 2- and 4-byte strs) is well covered.
_RANGES: dict[str, tuple[tuple[int, int], ...]] = {
    "digits": ((0x30, 0x39),),
    "ascii": ((0x20, 0x7E),),
    "control": ((0x00, 0x1F), (0x7F, 0x9F)),
    "latin1": ((0xA0, 0xFF),),
    "cjk": ((0x4E00, 0x9FFF),),
    "bmp": ((0x100, 0xD7FF), (0xE000, 0xFFFF)),
    "astral": ((0x10000, 0x1FFFF), (0x20000, 0x10FFFF)),
    "surrogate": ((0xD800, 0xDFFF),),
}


def random_key(rng: random.Random, *, surrogates: bool = True) -> str:
    """One random key of 0 to 300 code points (usually under 25)."""
    names = [n for n in _RANGES if surrogates or n != "surrogate"]
    palette = rng.sample(names, rng.randint(1, 3))
    if rng.random() < 0.5 and "ascii" not in palette:
        palette.append("ascii")
    length = rng.randint(0, 300) if rng.random() < 0.05 else rng.randint(0, 24)
    chars = []
    for _ in range(length):
        lo, hi = rng.choice(_RANGES[rng.choice(palette)])
        chars.append(chr(rng.randint(lo, hi)))
    return "".join(chars)


def random_keys(seed: int, count: int, *, surrogates: bool = True) -> list[str]:
    """``count`` random keys from ``seed`` (the same keys on every run)."""
    rng = random.Random(seed)
    return [random_key(rng, surrogates=surrogates) for _ in range(count)]


def encode_key(key: str) -> str:
    """Base64 of the key's UTF-16LE code units (lone surrogates kept)."""
    return base64.b64encode(key.encode("utf-16-le", "surrogatepass")).decode("ascii")


def decode_key(b64: str) -> str:
    """The inverse of :func:`encode_key`, up to surrogate pairing: two lone
    surrogates that form a pair come back as the one astral character (the
    same UTF-16 code units, so the same Java hash)."""
    return base64.b64decode(b64).decode("utf-16-le", "surrogatepass")


# --- Java ------------------------------------------------------------------------


def have_java() -> bool:
    return shutil.which("javac") is not None and shutil.which("java") is not None


def java_version() -> str:
    """First line of ``java -version`` (it prints to stderr)."""
    proc = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True)
    return (proc.stderr or proc.stdout).splitlines()[0].strip()


def compile_java(dest: Path) -> Path:
    """Compile JavaHash.java into ``dest``; return the class directory."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["javac", "-d", str(dest), str(JAVA_SOURCE)], check=True, capture_output=True, text=True)
    return dest


def run_java(classdir: Path, keys: Sequence[str]) -> list[tuple[int, tuple[int, ...]]]:
    """``(hashCode, floorMods)`` for each key, as printed by Java, with the
    floorMods in the order of :data:`MODULI`."""
    stdin = "".join(encode_key(k) + "\n" for k in keys)
    proc = subprocess.run(
        ["java", "-cp", str(classdir), "JavaHash"], input=stdin, capture_output=True, text=True, check=True
    )
    lines = proc.stdout.splitlines()
    header = lines[0].split()
    if header[0] != "moduli" or tuple(map(int, header[1:])) != MODULI:
        raise RuntimeError(f"JavaHash prints moduli {header[1:]}, this script expects {MODULI}")
    rows = [tuple(map(int, line.split())) for line in lines[1:]]
    if len(rows) != len(keys) or any(len(r) != 1 + len(MODULI) for r in rows):
        raise RuntimeError(f"JavaHash printed {len(rows)} rows for {len(keys)} keys")
    return [(r[0], r[1:]) for r in rows]


# --- the data file ------------------------------------------------------------------


def build_cases(classdir: Path) -> list[dict[str, object]]:
    named = fixed_keys() + [(f"random {i:03d}", k) for i, k in enumerate(random_keys(DATA_SEED, DATA_RANDOM_KEYS))]
    # Store each key as it reads back from its code units (and from JSON): a
    # random high surrogate followed by a random low one becomes one astral
    # character.  Same code units, same Java hash; the tests hash the
    # split-surrogate spelling of every key as well.
    named = [(name, decode_key(encode_key(key))) for name, key in named]
    results = run_java(classdir, [k for _, k in named])
    return [
        {"name": name, "key": key, "utf16le_b64": encode_key(key), "hash": h, "floor_mod": list(mods)}
        for (name, key), (h, mods) in zip(named, results, strict=True)
    ]


def render(cases: list[dict[str, object]], version: str) -> str:
    """The file's text: one case per line, so a diff shows which key changed."""
    head = {
        "about": "Java's String.hashCode and Math.floorMod(hashCode, n) per key; "
        "generated by tests/java/regen_java_hashes.py, do not edit",
        "java": version,
        "random_seed": DATA_SEED,
        "moduli": list(MODULI),
    }
    lines = ["{"]
    lines += [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    lines.append('  "cases": [')
    lines.append(",\n".join(f"    {json.dumps(c)}" for c in cases))
    lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    if not have_java():
        print("javac/java not found on PATH", file=sys.stderr)
        return 1
    version = java_version()
    with tempfile.TemporaryDirectory() as tmp:
        cases = build_cases(compile_java(Path(tmp)))
    text = render(cases, version)
    assert json.loads(text)["cases"] == cases
    DATA_FILE.parent.mkdir(parents=True, exist_ok=True)
    DATA_FILE.write_text(text, encoding="ascii")
    print(f"{version}: wrote {len(cases)} keys to {DATA_FILE}")
    for case in cases[:30]:
        print(f"  {case['name']:<40} {case['hash']:>12}  floorMod{MODULI} = {case['floor_mod']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
