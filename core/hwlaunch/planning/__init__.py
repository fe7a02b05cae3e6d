"""The planning layer: settings, runtime facts, the main-guard check, the rules, the registry.

Everything here is pure with respect to processes: it reads the environment, config files and
cheap probes, and returns a Plan. It never starts a process and never writes ``os.environ``.
"""
