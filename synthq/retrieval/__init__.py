"""Retrieval for evaluation: cached dense encoding, exact search, BM25, pytrec_eval metrics."""
