"""Sphinx configuration of the ``encoding`` documentation.

Build (warnings are errors; nothing is fetched from the network)::

    python -m sphinx -W -b html docs docs/_build/html

The pages are the Markdown files of this folder (MyST); the API reference is autodoc over the public ``__all__``
of each package; the model table is generated from :data:`encoding.models.ARCHITECTURES` at build time by the
local extension ``docs/_ext/encoding_docs.py``.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "_ext"))
sys.path.insert(0, os.path.dirname(HERE))  # the repository, so autodoc imports this checkout's encoding

from encoding.version import __version__  # noqa: E402

project = "encoding"
author = "encoding contributors"
copyright = "encoding contributors"
version = release = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "encoding_docs",
]
# No sphinx.ext.intersphinx: it fetches inventories over the network, and the build must work offline.

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
templates_path = []

# MyST: Markdown stays Markdown; headings get anchors so that `[Reliability](#reliability)` links resolve.
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# autodoc + napoleon (Google style docstrings)
autodoc_default_options = {"members": True, "member-order": "bysource", "show-inheritance": True,
                           "no-value": True}
#: Packages whose public ``__all__`` the API reference documents (docs/api/*.md); used by docs/_ext/encoding_docs.py.
encoding_api_modules = ("encoding.parallel", "encoding.memory", "encoding.nn", "encoding.models", "encoding.datasets",
                        "encoding.utils", "encoding.engine", "encoding.engine.builders", "encoding.inference",
                        "encoding.names")
autodoc_inherit_docstrings = False  # torch's docstrings (nn.Module.forward, autograd.Function) are not ours
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_class_signature = "mixed"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes:" of NamedTuples would otherwise describe the fields twice

# Nitpicky for our own objects: a reference to an ``encoding.*`` name that does not exist is an error. One reached
# through its defining module (encoding.models.base.FeatureInfo) links to the documented public name, and one to an
# existing object outside the API reference (a private helper) is plain text (docs/_ext/encoding_docs.py). torch,
# typing and the standard library are not documented here (no intersphinx), so references to them are plain text.
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!encoding\b).*")]

html_theme = "furo"
html_title = f"encoding {release}"
html_static_path = []
pygments_style = "default"
