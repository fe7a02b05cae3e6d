"""Other projects' engines driven by hwlaunch's executors (vLLM), each in a subpackage.

Why a package of its own: an integration imports the engine it drives, and ``import hwlaunch``
must never import a vendor's module. Nothing in hwlaunch's core imports this package (the CLI
may, lazily); each subpackage imports its engine only when one of its names is used.
"""
