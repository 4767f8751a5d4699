"""claimwarden: lifecycle of DRA ResourceClaims and the health of the devices behind them."""

# The one version source: pyproject.toml, the image's label and tag, the manifests' image tag and the user
# agent read it from here; `make release VERSION=x.y.z` stamps a copy of the tree, never this file.
__version__ = "0.1.0"
