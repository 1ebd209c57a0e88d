"""Empirical privacy audits: canary construction and exposure / rank / ε-lower-bound math."""
