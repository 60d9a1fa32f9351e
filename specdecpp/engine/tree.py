"""A token tree's round (docs/design.md, Token trees): the draft grows a tree level by level, one forward per level
over the nodes it expands under a tree attention mask; the target verifies every node in one forward; both caches
keep the accepted path, packed in place. Greedy output is the target's; sampled output follows its distribution."""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from specdecpp.compat import has_sliding_window
from specdecpp.engine.draft_step import CachedModel, EagerDraft
from specdecpp.engine.processing import Processing
from specdecpp.engine.schedules import ROOT
from specdecpp.engine.sampling import draft_noise, residual_distribution, sample, widened


@dataclass
class Candidate:
    """A child proposed at candidate `parent` (`rank` in draw order, at `depth`): `token`, the schedule's `score`
    (P(accept), earlier siblings rejected), `value` (what ranks it for the tree), `path_value` (estimated P(accept))."""

    parent: int
    rank: int
    token: int
    score: float
    depth: int = 1
    value: float = 0.0
    path_value: float = 0.0
    probs: torch.Tensor | None = None  # sampling: the distribution it was drawn from


@dataclass
class TokenTree:
    """One round's tree: node `i` holds `tokens[i]` at `depths[i]` (1: a root's child) under `parents[i]` (`ROOT` or an
    earlier node); `children[n]`: node `n`'s children in draw order; sampling, `draft_probs[n]`: their distribution."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    path_values: list[float] = field(default_factory=list)
    children: dict[int, list[int]] = field(default_factory=dict)
    draft_probs: dict[int, torch.Tensor] = field(default_factory=dict)

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


def tree_visibility(tree: TokenTree, prefix: int) -> torch.Tensor:
    """What each node of `tree` fed after `prefix` verified tokens sees, `[nodes, prefix + nodes]` (True: seen): the
    verified tokens, its ancestors and itself."""
    visible = torch.zeros(len(tree), prefix + len(tree), dtype=torch.bool)
    visible[:, :prefix] = True
    seen = [(node, prefix + n) for node in range(len(tree)) for n in tree.path(node)]
    visible[[node for node, _ in seen], [column for _, column in seen]] = True
    return visible


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
        together, _ = stepped.run(siblings, [past, past], tree_visibility(tree, past), num_logits=2)
        alone = [model(input_ids=torch.tensor([prompt + [token]], device=model.device)).logits[0, -1]
                 for token in siblings]
    if not all(torch.allclose(widened(row), widened(single), atol=1e-4, rtol=1e-3)
               for row, single in zip(together, alone)):
        raise ValueError(f"{who} ({type(model).__name__}) does not honour a 4D attention mask with explicit positions, "
                         "which a token tree needs: use a chain schedule (ada, dynamic, ...) with it, or load it with "
                         "attn_implementation='sdpa'")
    _CHECKED[model] = True


def processed_rows(processing: Processing, seq: list[int], paths: list[list[int]], logits: torch.Tensor) -> torch.Tensor:
    """Row `i` of `logits` processed with the prefix `seq + paths[i]`, as `generate` processes that position."""
    logits = widened(logits)
    if not processing.reads_prefix:
        return processing.logits(seq, logits) if processing.changes_logits else logits
    return torch.cat([processing.logits(seq + path, row[None]) for path, row in zip(paths, logits)])


def proposals(processed: torch.Tensor, width: int, do_sample: bool,
              generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each node's `width` children `[nodes, width]` from its row of processed logits `[nodes, vocab]`: greedy its
    most likely tokens, sampling draws without replacement (the exponential race, whose first draw is the chain's
    token; one noise draw per row, in order); and the distributions they come from."""
    probs = processed.softmax(-1)
    if not do_sample:
        return processed.topk(width, dim=-1).indices, probs
    noise = torch.stack([draft_noise(probs.shape[-1], probs.device, generator) for _ in range(len(probs))])
    return (probs / noise).topk(width, dim=-1).indices, probs


def scored_children(draft, policy, seq: list[int], paths: list[list[int]], rows: torch.Tensor,
                    states: torch.Tensor | None, processing: Processing, generator: torch.Generator | None
                    ) -> tuple[list[list[int]], list[list[float]], torch.Tensor | None]:
    """The children of one level's nodes (after `seq` and `paths`, raw logits `rows`), tokens of probability 0 left
    out, their scores and (sampling) distributions: as the draft's graph chose and scored them, where it did."""
    if draft.scored is not None:
        tokens, scores = draft.scored.tolist()
        return [[int(t) for t in row] for row in tokens], scores, None
    processed = processed_rows(processing, seq, paths, rows)
    children, probs = proposals(processed, policy.width, processing.do_sample, generator)
    scores = policy.score_children(widened(rows), probs, None if processing.changes_logits else probs, states,
                                   children)
    kept = (probs.gather(-1, children) > 0).sum(-1).tolist()  # zeros come last: drawn after every other token
    return ([row[:n] for row, n in zip(children.tolist(), kept)], [row[:n] for row, n in zip(scores.tolist(), kept)],
            probs)


def grow_tree(draft: EagerDraft, seq: list[int], policy, max_depth: int, processing: Processing,
              generator: torch.Generator | None, stats) -> tuple[TokenTree, dict[int, int]]:
    """A tree after `seq` of at most `max_depth` levels: each level expands, in one draft forward, the candidates
    of the newest level `policy.expand` picks (their children scored by `policy.score_children`); then the tree
    is the candidates `policy.select` keeps. Returns it and the draft cache's position of each node it was fed."""
    drafted: list[Candidate] = []
    slots: dict[int, int] = {}  # candidate -> its position in the draft's cache
    if max_depth < 1:
        stats.tree_level_widths.append([])
        return TokenTree(), {}
    start = time.perf_counter()
    logits, hidden = draft.forward(seq, num_logits=1, with_hidden_states=draft.with_hidden_states)
    prefix, expanded, widths, level_seconds = len(seq), [ROOT], [], 0.0
    rows, states = logits, hidden[None] if hidden is not None else None
    while True:
        widths.append(len(expanded))
        paths = [[] if n == ROOT else [drafted[a].token for a in _ancestry(drafted, n)] for n in expanded]
        children, scores, probs = scored_children(draft, policy, seq, paths, rows, states, processing, generator)
        newest = []
        for i, parent in enumerate(expanded):
            depth = 1 if parent == ROOT else drafted[parent].depth + 1
            valued = policy.valued([Candidate(parent, rank, token, score, depth) for rank, (token, score)
                                    in enumerate(zip(children[i], scores[i]))],
                                   1.0 if parent == ROOT else drafted[parent].path_value)
            for child in valued:
                child.probs = probs[i] if processing.do_sample else None
            newest += valued
        first = len(drafted)
        drafted += newest
        drafted_at = time.perf_counter()
        stats.draft_time += drafted_at - start
        stats.draft_calls += 1
        expanded = [first + i for i in policy.expand(newest, drafted, widths) if newest[i].depth < max_depth]
        stats.schedule_time += time.perf_counter() - drafted_at
        if len(widths) > 1:  # the root's level may feed a prompt
            level_seconds += time.perf_counter() - start
        if not expanded:
            break
        start = time.perf_counter()
        rows, states = _expand(draft, drafted, expanded, slots, prefix)
    decided = time.perf_counter()
    tree, node_of, fed = TokenTree(), {ROOT: ROOT}, {}
    stats.tree_level_widths.append(widths)
    chosen = policy.select(drafted, widths)
    policy.weigh(drafted, chosen, widths)
    policy.observe_levels(widths, level_seconds)
    for index in chosen:
        candidate = drafted[index]
        if candidate.parent not in node_of:
            continue
        node = tree.add(Candidate(node_of[candidate.parent], candidate.rank, candidate.token, candidate.score,
                                  candidate.depth, candidate.value, candidate.path_value))
        node_of[index] = node
        if processing.do_sample:
            tree.draft_probs[node_of[candidate.parent]] = candidate.probs
        if index in slots:
            fed[node] = slots[index]
    stats.schedule_time += time.perf_counter() - decided
    return tree, fed


def _ancestry(drafted: list[Candidate], index: int) -> list[int]:
    """The candidates from the first level down to `index`."""
    chain = []
    while index != ROOT:
        chain.append(index)
        index = drafted[index].parent
    return chain[::-1]


def _expand(draft: EagerDraft, drafted: list[Candidate], nodes: list[int], slots: dict[int, int], prefix: int):
    """One draft forward over `nodes`, each after its ancestors at `slots`: their logits and any hidden states."""
    past = prefix + len(slots)
    visible = torch.zeros(len(nodes), past + len(nodes), dtype=torch.bool)
    visible[:, :prefix] = True
    seen = [(row, slots[ancestor]) for row, node in enumerate(nodes) for ancestor in _ancestry(drafted, node)[:-1]]
    seen += [(row, past + row) for row in range(len(nodes))]
    visible[[row for row, _ in seen], [column for _, column in seen]] = True
    for row, node in enumerate(nodes):
        slots[node] = past + row
    positions = [prefix - 1 + drafted[node].depth for node in nodes]
    return draft.run([drafted[n].token for n in nodes], positions, visible, len(nodes), draft.with_hidden_states)


def verify_tree(target: CachedModel, seq: list[int], tree: TokenTree, processing: Processing,
                generator: torch.Generator | None) -> tuple[list[int], int]:
    """One target forward over the last verified token and every node of `tree`, each node after its own path;
    returns the accepted path (nodes) and the token the target adds. Greedy follows the target's argmax down the
    tree; sampling runs recursive rejection sampling over each node's children in their draw order."""
    seen, prefix = target.length, len(seq)
    unseen, nodes = seq[seen:], list(range(len(tree)))
    # The verified tokens the cache has not seen yet (the last one at least) come first, causally.
    causal = torch.arange(prefix + len(tree))[None] <= torch.arange(seen, prefix)[:, None]
    visible = torch.cat([causal, tree_visibility(tree, prefix)])
    positions = list(range(seen, prefix)) + [prefix - 1 + d for d in tree.depths]
    logits, _ = target.run(unseen + tree.tokens, positions, visible, num_logits=len(tree) + 1)
    processed = processed_rows(processing, seq, [[]] + [tree.path_tokens(n) for n in nodes], logits)
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
