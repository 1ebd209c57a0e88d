"""Config of ``synthq search``: a retriever, a corpus and the queries to try it on."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from synthq.config.fields import Device, PathOrName, cli


class SearchConfig(BaseModel):
    """``synthq search``: the top-k documents of a corpus for a query, with their scores.

    Not a stage (it writes no artifact), but its options come from these fields as a stage's do."""

    model_config = ConfigDict(extra="forbid")

    query: list[str] = Field(
        min_length=1,
        description="The query (several words, or several quoted queries with --each).",
        json_schema_extra=cli(argument=True, required=True, commas=False),
    )
    retriever: PathOrName = Field(
        description="A train-retriever artifact, or an encoder (alias, directory, hub id).",
        json_schema_extra=cli(metavar="DIR"),
    )
    corpus: PathOrName = Field(
        "embedded",
        description="Documents: a BEIR directory or source name.",
        json_schema_extra=cli(metavar="SOURCE"),
    )
    top_k: int = Field(10, ge=1, description="Documents shown per query.", json_schema_extra=cli(metavar="N"))
    each: bool = Field(False, description="Treat each argument as its own query.")
    device: Device = Field("auto", json_schema_extra=cli(metavar="DEVICE"))
    as_json: bool = Field(
        False, description="Print the hits as JSON lines.", json_schema_extra=cli(flag="--json")
    )

    def queries(self) -> list[str]:
        """The queries to search: each argument with ``each``, else all of them as one query."""
        return list(self.query) if self.each else [" ".join(self.query)]
