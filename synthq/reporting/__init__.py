"""Reporting: results tables, row labels, systems merged across evals, plots."""
