"""claimwarden: lifecycle of DRA ResourceClaims and the health of the devices behind them."""

__version__ = "0.1.0"
