"""The bottom layer: the model and its protocol, hook sites, tokens, errors, artifacts.

Everything else in mechlingo builds on these; they import nothing from the rest of the
package (``scripts/check_layers.py`` enforces the layering).
"""
