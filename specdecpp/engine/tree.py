"""A token tree's round (docs/design.md, Token trees): the draft grows a tree level by level, each level one
forward over the nodes it expands under a tree attention mask; the target verifies every node in one forward and
the loop keeps the accepted path, packed into place in both caches. Greedy output is the target's; sampled output
follows its distribution (recursive rejection sampling over each node's children)."""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from specdecpp.compat import has_sliding_window
from specdecpp.engine.draft_step import CachedModel, EagerDraft
from specdecpp.engine.processing import Processing
from specdecpp.engine.sampling import draft_noise, residual_distribution, sample, widened

ROOT = -1  # the parent of the first level: the last verified token


@dataclass
class Candidate:
    """A child the draft proposes at `parent` (`rank` in its draw order): `token`, the schedule's `score` (its
    P(accept) given that the earlier siblings were not accepted) and, set by the schedule, `value` (what ranks it
    for a place in the tree) and `path_value` (the estimated probability that it is accepted)."""

    parent: int
    rank: int
    token: int
    score: float
    value: float = 0.0
    path_value: float = 0.0


@dataclass
class TokenTree:
    """One round's tree: node `i` holds `tokens[i]` at `depths[i]` (1 for a child of the root) under `parents[i]`
    (`ROOT` or an earlier node); `children[n]` lists each expanded node's children in draw order and, when
    sampling, `draft_probs[n]` the distribution they were drawn from; `fed` the nodes the draft's cache holds, in
    order after the verified tokens."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    path_values: list[float] = field(default_factory=list)
    children: dict[int, list[int]] = field(default_factory=dict)
    draft_probs: dict[int, torch.Tensor] = field(default_factory=dict)
    fed: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, candidate: Candidate) -> int:
        """Add `candidate` as a node; its index."""
        node = len(self.tokens)
        self.tokens.append(candidate.token)
        self.parents.append(candidate.parent)
        self.depths.append(1 if candidate.parent == ROOT else self.depths[candidate.parent] + 1)
        self.path_values.append(candidate.path_value)
        self.children.setdefault(candidate.parent, []).append(node)
        return node

    def path(self, node: int) -> list[int]:
        """The nodes from the root's first child down to `node`."""
        nodes = []
        while node != ROOT:
            nodes.append(node)
            node = self.parents[node]
        return nodes[::-1]

    def path_tokens(self, node: int) -> list[int]:
        return [self.tokens[n] for n in self.path(node)]


def tree_attention_mask(tree: TokenTree, nodes: list[int], slot: dict[int, int], prefix: int, past: int,
                        dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The 4D additive mask `[1, 1, len(nodes), past + len(nodes)]` of feeding `nodes` after a cache of `past`
    positions: each node sees the first `prefix` positions (the verified tokens), its ancestors (at cache positions
    `slot[ancestor]`, or among the fed nodes) and itself."""
    visible = torch.zeros(len(nodes), past + len(nodes), dtype=torch.bool)
    visible[:, :prefix] = True
    fed_at = {node: past + i for i, node in enumerate(nodes)}
    for row, node in enumerate(nodes):
        ancestor = node
        while ancestor != ROOT:
            visible[row, fed_at[ancestor] if ancestor in fed_at else slot[ancestor]] = True
            ancestor = tree.parents[ancestor]
    mask = torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)
    return mask[None, None].to(device)


_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_tree_attention(model: PreTrainedModel, who: str) -> None:
    """ValueError unless `model` honours a tree attention mask: two sibling tokens fed at one position under a 4D
    mask must give the logits each gives alone (checked once per model)."""
    if model in _CHECKED:
        return
    if has_sliding_window(model):
        raise ValueError(f"{who} has sliding-window attention, which a token tree's attention mask does not cover: "
                         "use a chain schedule (ada, dynamic, ...) with this model")
    prompt, siblings = [1, 2, 3], [4, 5]
    with torch.inference_mode():
        stepped = CachedModel(model)
        stepped.forward(prompt, num_logits=1)
        tree = TokenTree()
        for rank, token in enumerate(siblings):
            tree.add(Candidate(ROOT, rank, token, 1.0))
        past = len(prompt)
        mask = tree_attention_mask(tree, [0, 1], {}, past, past, model.dtype, model.device)
        together, _ = stepped.run(siblings, [past, past], mask, num_logits=2)
        alone = [model(input_ids=torch.tensor([prompt + [token]], device=model.device)).logits[0, -1]
                 for token in siblings]
    if not all(torch.allclose(widened(row), widened(single), atol=1e-4, rtol=1e-3)
               for row, single in zip(together, alone)):
        raise ValueError(f"{who} ({type(model).__name__}) does not "
                         "honour a 4D attention mask with explicit positions, which a token tree needs: use a chain "
                         "schedule (ada, dynamic, ...) with it, or load it with attn_implementation='sdpa'")
    _CHECKED[model] = True


def processed_rows(processing: Processing, seq: list[int], paths: list[list[int]], logits: torch.Tensor) -> torch.Tensor:
    """Row `i` of `logits` processed with the prefix `seq + paths[i]`, as `generate` processes that position."""
    logits = widened(logits)
    if not processing.reads_prefix:
        return processing.logits(seq, logits) if processing.changes_logits else logits
    return torch.cat([processing.logits(seq + path, row[None]) for path, row in zip(paths, logits)])


def proposals(processed: torch.Tensor, width: int, do_sample: bool,
              generator: torch.Generator | None) -> tuple[list[int], torch.Tensor]:
    """A node's children from its processed logits `[vocab]`: greedy its `width` most likely tokens, sampling
    `width` draws without replacement (the exponential race, whose first draw is the chain's token), leaving out
    tokens of probability 0; and the distribution `[vocab]` they come from."""
    probs = processed.softmax(-1)
    if not do_sample:
        return processed.topk(width).indices.tolist(), probs
    race = probs / draft_noise(probs.shape[-1], probs.device, generator)
    order = race.topk(width).indices
    return order[probs[order] > 0].tolist(), probs


def grow_tree(draft: EagerDraft, seq: list[int], policy, max_depth: int, processing: Processing,
              generator: torch.Generator | None, stats) -> TokenTree:
    """A tree of at most `policy.max_nodes()` nodes and `max_depth` levels after `seq`: each level adds the
    candidates `policy.choose` picks and, in one draft forward, expands those `policy.expands` (their children
    scored by `policy.score_children`)."""
    tree, pool = TokenTree(), []
    if max_depth < 1:
        return tree
    start = time.perf_counter()
    logits, hidden = draft.forward(seq, num_logits=1, with_hidden_states=draft.with_hidden_states)
    prefix = len(seq)
    expanded = [ROOT]
    rows, states = logits, hidden[None] if hidden is not None else None
    while True:
        processed = processed_rows(processing, seq, [tree.path_tokens(n) if n != ROOT else [] for n in expanded], rows)
        for i, node in enumerate(expanded):
            tokens, probs = proposals(processed[i], policy.width, processing.do_sample, generator)
            if processing.do_sample:
                tree.draft_probs[node] = probs
            state = states[i] if states is not None else None
            raw_probs = None if processing.changes_logits else probs
            scores = policy.score_children(widened(rows[i]), probs, raw_probs, state, tokens)
            parent_value = 1.0 if node == ROOT else tree.path_values[node]
            pool += policy.valued([Candidate(node, rank, token, score) for rank, (token, score)
                                   in enumerate(zip(tokens, scores))], parent_value)
        drafted_at = time.perf_counter()
        stats.draft_time += drafted_at - start
        stats.draft_calls += 1
        chosen = policy.choose(pool, tree)
        added = [tree.add(candidate) for candidate in chosen]
        pool = [candidate for candidate in pool if candidate not in chosen]
        expanded = [node for node in added if tree.depths[node] < max_depth and policy.expands(tree, node)]
        stats.schedule_time += time.perf_counter() - drafted_at
        if not expanded or len(tree) >= policy.max_nodes():
            return tree
        start = time.perf_counter()
        rows, states = _expand(draft, tree, expanded, prefix)


def _expand(draft: EagerDraft, tree: TokenTree, nodes: list[int], prefix: int):
    """One draft forward over `nodes` (each after its path); their logits and, for a head, hidden states."""
    past = prefix + len(tree.fed)
    slot = {node: prefix + i for i, node in enumerate(tree.fed)}
    mask = tree_attention_mask(tree, nodes, slot, prefix, past, draft.model.dtype, draft.device)
    positions = [prefix - 1 + tree.depths[node] for node in nodes]
    tree.fed += nodes
    return draft.run([tree.tokens[n] for n in nodes], positions, mask, len(nodes), draft.with_hidden_states)


def verify_tree(target: CachedModel, seq: list[int], tree: TokenTree, processing: Processing,
                generator: torch.Generator | None) -> tuple[list[int], int]:
    """One target forward over the last verified token and every node of `tree`, each node after its own path;
    returns the accepted path (nodes) and the token the target adds. Greedy follows the target's argmax down the
    tree; sampling runs recursive rejection sampling over each node's children in their draw order."""
    seen, prefix = target.cache.get_seq_length(), len(seq)
    unseen, nodes = seq[seen:], list(range(len(tree)))
    tree_rows = tree_attention_mask(tree, nodes, {}, prefix, prefix, target.model.dtype, target.device)
    # The verified tokens the cache has not seen yet (the last one at least) come first, causally.
    columns = torch.arange(prefix + len(tree), device=target.device)
    causal = columns[None] <= torch.arange(seen, prefix, device=target.device)[:, None]
    causal_rows = torch.zeros(causal.shape, dtype=tree_rows.dtype, device=target.device).masked_fill(
        ~causal, torch.finfo(tree_rows.dtype).min)
    mask = torch.cat([causal_rows[None, None], tree_rows], dim=2)
    positions = list(range(seen, prefix)) + [prefix - 1 + d for d in tree.depths]
    logits, _ = target.run(unseen + tree.tokens, positions, mask, num_logits=len(tree) + 1)
    paths = [[]] + [tree.path_tokens(n) for n in nodes]
    processed = processed_rows(processing, seq, paths, logits)
    row = {ROOT: 0, **{n: n + 1 for n in nodes}}
    path, node = [], ROOT
    if not processing.do_sample:
        chosen = processed.argmax(-1).tolist()
        while True:
            token = chosen[row[node]]
            match = [child for child in tree.children.get(node, []) if tree.tokens[child] == token]
            if not match:
                return path, token
            node = match[0]
            path.append(node)
    target_probs = processed.softmax(-1)
    while True:
        p = target_probs[row[node]]
        accepted = None
        if node in tree.draft_probs and tree.children.get(node):
            q = tree.draft_probs[node]
            for child in tree.children[node]:
                token = tree.tokens[child]
                uniform = torch.rand((), generator=generator, device=p.device)
                if uniform * q[token] < p[token]:  # accepted with min(1, p / q)
                    accepted = child
                    break
                p = residual_distribution(p, q)
                q = q.clone()
                q[token] = 0
                q = q / q.sum().clamp_min(torch.finfo(q.dtype).tiny)
        if accepted is None:
            return path, int(sample(p[None], generator))
        node = accepted
        path.append(node)
