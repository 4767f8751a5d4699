"""The local lab: a real control plane, kwok nodes and a fake DRA driver on one machine."""
