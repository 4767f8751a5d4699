"""claimwarden's release tooling (`make release`): a development tool beside the operator, never in the image.

plan.py decides (versions, refusals, the pinned image, checksums) from plain data; build.py does the I/O.
"""
