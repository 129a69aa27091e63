"""Build the compiled kernels: what pyproject.toml cannot express.

Every ``_ext/<stem>.pyx`` becomes the extension module ``lite_push._kernels.<stem>``
(``_ext/router_c.pyx`` -> ``lite_push._kernels.router_c``); each has a pure-Python
twin in the package, chosen by a selector module when the extension is absent.

``LITE_PUSH_NO_EXTENSIONS`` set to any non-empty value builds none (the same
rule ``lite_push/_kernels/router.py`` uses to force the twins at run time).  Otherwise a
Cython or C compile error fails the build: there is deliberately no silent
fallback, so a broken extension cannot reach CI disguised as the twin.

An editable install (``pip install -e .``) builds in place, so the ``.so``
lands next to the sources in ``lite_push/_kernels/``, where the import finds it.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent
EXT_DIR = "_ext"
PACKAGE = "lite_push._kernels"


def _extensions() -> list[Extension]:
    if os.environ.get("LITE_PUSH_NO_EXTENSIONS"):
        return []

    from Cython.Build import cythonize  # build-system requires Cython

    # Relative paths: setuptools wants them, and they keep absolute build
    # paths out of the generated C.
    sources = sorted(p.relative_to(HERE).as_posix() for p in (HERE / EXT_DIR).glob("*.pyx"))
    if not sources:
        raise SystemExit(
            f"lite-push: no {EXT_DIR}/*.pyx found to compile; "
            "set LITE_PUSH_NO_EXTENSIONS=1 to build the pure-Python package"
        )
    extensions = [
        Extension(
            f"{PACKAGE}.{Path(src).stem}",
            [src],
            include_dirs=[EXT_DIR],
            depends=sorted(str(h.relative_to(HERE)) for h in (HERE / EXT_DIR).glob("*.h")),
            extra_compile_args=["-O3"],
        )
        for src in sources
    ]
    return cythonize(
        extensions,
        compiler_directives={"language_level": 3, "embedsignature": True},
        quiet=True,
    )


setup(ext_modules=_extensions())
