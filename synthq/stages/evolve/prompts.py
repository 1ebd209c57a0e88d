"""The public model's prompts in ``synthq evolve``: a new query for a document (Private
Evolution's random API) and another query like a given one (its variation API).

Only public text is ever in a prompt: the documents are public, the few-shot examples are
hand-written, and a query to vary is one the public model wrote and the noisy vote chose.
"""

from __future__ import annotations

from synthq.config.generator import EvolveConfig
from synthq.models.generator import QueryGenerator
from synthq.models.sampling import Request, length_sorted_batches, sample_with_retries
from synthq.runtime.console import progress

MAX_RESAMPLE = 3
# Few-shot prompts on two public, hand-written examples (no private query is ever in a prompt).
# Measured on the demo's documents with SmolLM2-135M-Instruct: plain completion after these
# examples writes query-like text ("how do you sleep better"); the same request as a chat turn
# made it write prose about the document.
EXAMPLES = (
    (
        "The Eiffel Tower is a wrought-iron lattice tower in Paris, 330 metres tall, completed in 1889.",
        "how tall is the eiffel tower",
        "eiffel tower height in metres",
    ),
    (
        "Preheat the oven to 180 C. Cream the butter and sugar, add eggs one at a time, fold in the "
        "flour and bake for 25 minutes.",
        "simple sponge cake recipe",
        "how long to bake a sponge cake",
    ),
)
RANDOM_PROMPT = (
    "Write the search query a person would type to find each document.\n\n"
    + "".join(f"Document: {document}\nQuery: {query}\n\n" for document, query, _ in EXAMPLES)
    + "Document: {document}\nQuery:"
)
VARIATION_PROMPT = (
    "Write two different search queries a person would type to find each document.\n\n"
    + "".join(
        f"Document: {document}\nQuery: {query}\nAnother query: {other}\n\n"
        for document, query, other in EXAMPLES
    )
    + "Document: {document}\nQuery: {query}\nAnother query:"
)


class Prompter:
    """The public model's two prompts: a new query for a document (random API) and another query
    like a given one (variation API). Causal models (base or instruct) complete a few-shot prompt
    (:data:`RANDOM_PROMPT`, :data:`VARIATION_PROMPT`); seq2seq models get their
    ``generate_query:`` input (the variation appends the query to vary)."""

    def __init__(self, generator: QueryGenerator):
        self.generator = generator
        # Prompts are complete strings: a generator that formats nothing and truncates nothing.
        self.prompting = QueryGenerator(
            generator.model, generator.tokenizer, 1_000_000, template="{document}"
        )

    def random(self, document: str) -> str:
        if self.generator.kind == "seq2seq":
            return document
        return RANDOM_PROMPT.replace("{document}", document)

    def variation(self, document: str, query: str) -> str:
        if self.generator.kind == "seq2seq":
            return f"{document} query: {query}"
        return VARIATION_PROMPT.replace("{document}", document).replace("{query}", query)

    def generate(self, prompts: dict[tuple[str, int], str], config: EvolveConfig, description: str) -> dict:
        """``(doc_id, index) -> query`` for every prompt, in batches of similar length."""
        requests = [Request(doc_id, prompt, index) for (doc_id, index), prompt in prompts.items()]
        written = {}
        with progress() as bar:
            task = bar.add_task(description, total=len(requests))
            for batch in length_sorted_batches(requests, self.prompting, config.generation_batch_size):
                results = sample_with_retries(
                    self.prompting, batch, config.generation_seed, config.top_p, config.temperature,
                    config.max_new_tokens, MAX_RESAMPLE,
                )  # fmt: skip
                written.update({key: result["query"] for key, result in results.items()})
                bar.advance(task, len(batch))
        return written
