"""The one place Chital reaches into its libraries' private internals (docs/design.md, "Vendor
boundary"): one module per library, each holding the reaches for it and nothing else, and
:mod:`compat.versions`, the releases they were verified on and the start-up check of them.

Imports none of gateway, channels and agent (import-linter). Deliberately empty: the import hook
(:mod:`compat.lean_imports`) is imported by the entry point before any library, so importing this
package must load nothing.
"""
