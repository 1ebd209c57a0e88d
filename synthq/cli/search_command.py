"""``synthq search``: try a retriever on a corpus and print the top-k documents of each query.

Its options are the fields of :class:`synthq.config.search.SearchConfig` (registered in
:mod:`synthq.cli.app` with :func:`synthq.cli.options.config_command`); the search itself is
:func:`synthq.search.search`.
"""

from __future__ import annotations

import json

import typer
from rich.markup import escape

from synthq.cli.options import ConfigOptions
from synthq.runtime.console import result


def search_command(options: ConfigOptions) -> None:
    """Try a retriever: the top-k documents of a corpus for a query, with their scores.

    Corpus embeddings are cached (as eval's are), so a second query on the same corpus only
    encodes the query."""
    config = options.config()  # options are checked before the search loads anything
    from synthq.search import search

    queries = config.queries()
    hits = search(config.retriever, config.corpus, queries, top_k=config.top_k, device=config.device)
    for text, ranked in zip(queries, hits, strict=True):
        if config.as_json:
            for rank, hit in enumerate(ranked, 1):
                typer.echo(json.dumps({"query": text, "rank": rank, **hit}))
            continue
        result(f"[bold]{escape(text)}[/]")
        for rank, hit in enumerate(ranked, 1):
            title = f"{hit['title']}: " if hit["title"] else ""
            result(
                f"  {rank:2d}. {hit['score']:.4f}  {hit['doc_id']}  {escape(_shorten(title + hit['text']))}"
            )


def _shorten(text: str, width: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
