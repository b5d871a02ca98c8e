"""RULER's generators (NVIDIA/RULER scripts/data/synthetic/{niah,variable_tracking,qa}.py), one class
each, and their base; the aggregation tasks (common/freq words) are in tasks/ruler_gen_aggregation.py.

Each `build(n, rng, nprng, index)` is RULER's `generate_input_output`: it returns the prompt text
(model wrapper + task template + answer prefix, as RULER's prepare.py assembles it) and the gold
answers for a haystack of `n` units (lines, words, documents). The random calls are RULER's, in
RULER's order, on `rng` (for `random`) and `nprng` (for `np.random`); the fixed-seed shuffles
RULER does with `random.Random(args.random_seed)` use the task seed. Only the source of
randomness differs: RULER runs one global stream per task and length, we seed every sample on
its own (tasks/ruler.py) so that a sample does not depend on how many came before it.
"""
from __future__ import annotations

import random
import string
import uuid

import numpy as np

from common.errors import ConfigError
from tasks import ruler_data as data
from tasks.ruler_spec import (
    DOCUMENT_PROMPT,
    MODEL_TEMPLATES,
    NEEDLE,
    NOISE,
    TEMPLATES,
    templates,
)

# niah.py / variable_tracking.py: 40 insertion depths, in percent.
DEPTHS = list(np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int))


def wrap_template(wrap: str, task_template: str) -> str:
    """prepare.py: `model_template.format(task_template=...) + answer_prefix` is done by callers;
    this is the first half."""
    return wrap.format(task_template=task_template)


class Generator:
    key = ""              # the generator's name in TEMPLATES
    unit = ""             # what `n` counts

    def __init__(self, args: dict, wrap: str, seed: int, cfg, max_seq_length: int):
        self.args, self.wrap, self.seed, self.cfg, self.length = args, wrap, seed, cfg, max_seq_length
        t = templates(cfg.get("prompt_version", "original"))[self.key]
        self.template = wrap_template(wrap, t["template"]) + t["answer_prefix"]

    @property
    def tokens_to_generate(self) -> int:
        return TEMPLATES[self.key]["tokens_to_generate"]

    def incremental(self) -> int:
        raise NotImplementedError

    def estimate_units(self) -> int:
        """How many units the first probe of the size search uses (RULER: `incremental`)."""
        return self.incremental()

    def upper_bound(self, tokens_per_unit: float) -> int:
        """RULER: 3x the units the length would hold at the probe's density."""
        return int((self.length / tokens_per_unit) * 3)

    def min_units(self, index: int) -> int:
        return 1

    def max_units(self) -> int | None:
        """The most units the generator can build (None: unbounded)."""
        return None

    def cap_error(self) -> str:
        return f"RULER {self.key} cannot fill length {self.length}"

    def build(self, n: int, rng: random.Random, nprng: np.random.RandomState, index: int):
        raise NotImplementedError


def _insert_in_sentences(sents: list[str], items: list[str], rng: random.Random) -> str:
    """niah.py / variable_tracking.py essay branch: items go between sentences at random depths."""
    pos = [0] + sorted(int(len(sents) * (d / 100)) for d in rng.sample(DEPTHS, len(items))) + [len(sents)]
    out = []
    for i in range(1, len(pos)):
        out.append(" ".join(sents[pos[i - 1]:pos[i]]))
        if i - 1 < len(items):
            out.append(items[i - 1])
    return " ".join(out)


class Niah(Generator):
    key, unit = "niah", "haystack"

    def __init__(self, args, wrap, seed, cfg, max_seq_length):
        super().__init__(args, wrap, seed, cfg, max_seq_length)
        a = self.args = dict(args)
        a["num_needle_k"] = max(a["num_needle_k"], a["num_needle_q"])
        t = TEMPLATES["niah"]
        task, prefix, self.type_v = t["template"], t["answer_prefix"], a["type_needle_v"]
        if a["num_needle_q"] * a["num_needle_v"] == 1:
            # RULER applies these to the wrapped template. With RULER's own wrappers we do the
            # same (vicuna's "answers" becomes "answer", as in RULER); with a tokenizer's chat
            # template only the task template and answer prefix are rewritten, so that its own
            # text ("You are a helpful ...") is not turned into "You is a helpful ...".
            whole = wrap in MODEL_TEMPLATES.values()
            task = wrap_template(wrap, task) if whole else task
            for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
                task, prefix = task.replace(old, new), prefix.replace(old, new)
            self.type_v = self.type_v[:-1]
            self.template = (task if whole else wrap_template(wrap, task)) + prefix
        else:
            self.template = wrap_template(wrap, task) + prefix
        self.haystack_kind = a["type_haystack"]
        if self.haystack_kind == "essay":
            self.essay = data.essay_words(cfg.get("essay_path"), cfg.get("essay_hub_id") or data.ESSAY_HUB_ID)
            self.split = data.sentence_splitter(cfg.get("sentence_splitter", "punkt"))
        elif self.haystack_kind not in ("noise", "needle"):
            raise ConfigError(f"RULER niah haystack {self.haystack_kind!r} is not implemented")
        for t_ in (a["type_needle_k"], a["type_needle_v"]):
            if t_ not in ("numbers", "words", "uuids"):
                raise ConfigError(f"RULER niah needle type {t_!r} is not implemented")

    def incremental(self) -> int:
        if self.haystack_kind == "essay":
            return 500
        return 5 if self.length < 4096 else 25

    def min_units(self, index):
        # noise / needle lines are sampled as insertion points, one per needle
        return 1 if self.haystack_kind == "essay" else self.args["num_needle_k"] * self.args["num_needle_v"]

    def _random(self, kind: str, rng: random.Random) -> str:
        if kind == "numbers":
            return str(rng.randint(10 ** 6, 10 ** 7 - 1))
        if kind == "words":
            return rng.choice(data.niah_words())
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))

    def build(self, n, rng, nprng, index):
        a = self.args
        keys, values, needles = [], [], []
        for _ in range(a["num_needle_k"]):
            keys.append(self._random(a["type_needle_k"], rng))
            value = []
            for _ in range(a["num_needle_v"]):
                value.append(self._random(a["type_needle_v"], rng))
                needles.append(NEEDLE.format(type_needle_v=a["type_needle_v"], key=keys[-1], value=value[-1]))
            values.append(value)
        random.Random(self.seed).shuffle(needles)

        if self.haystack_kind == "essay":
            hay = self.essay
            words = hay[:n] if n <= len(hay) else (hay * ((n + len(hay) - 1) // len(hay)))[:n]
            context = _insert_in_sentences(self.split(" ".join(words).strip()), needles, rng)
        else:
            if self.haystack_kind == "noise":
                sentences = [NOISE] * n
            else:
                sentences = [NEEDLE.format(type_needle_v=a["type_needle_v"],
                                           key=self._random(a["type_needle_k"], rng),
                                           value=self._random(a["type_needle_v"], rng)) for _ in range(n)]
            for i, needle in zip(sorted(rng.sample(range(n), len(needles)), reverse=True), needles):
                sentences.insert(i, needle)
            context = "\n".join(sentences)

        picked = rng.sample(range(a["num_needle_k"]), a["num_needle_q"])
        queries = [keys[i] for i in picked]
        answers = [v for i in picked for v in values[i]]
        query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
        return self.template.format(type_needle_v=self.type_v, context=context, query=query), answers


class VariableTracking(Generator):
    key, unit = "variable_tracking", "noise"

    def __init__(self, args, wrap, seed, cfg, max_seq_length):
        super().__init__(args, wrap, seed, cfg, max_seq_length)
        self.haystack_kind = args["type_haystack"]
        if self.haystack_kind == "essay":
            self.essay = data.essay_words(cfg.get("essay_path"), cfg.get("essay_hub_id") or data.ESSAY_HUB_ID)
            self.split = data.sentence_splitter(cfg.get("sentence_splitter", "punkt"))
        elif self.haystack_kind != "noise":
            raise ConfigError(f"RULER vt haystack {self.haystack_kind!r} is not implemented")
        t = templates(cfg.get("prompt_version", "original"))["variable_tracking"]
        self.bare = t["template"] + t["answer_prefix"]
        self.icl = None   # set by make_icl (the one-shot example, as RULER builds it first)

    def incremental(self) -> int:
        if self.haystack_kind == "essay":
            return 500
        return 5 if self.length < 4096 else 10

    def min_units(self, index):
        # noise lines are sampled as insertion points, one per chain element
        return 1 if self.haystack_kind == "essay" else self.args["num_hops"] + 1

    def _chains(self, hops: int, rng, nprng, is_icl: bool):
        num_chains = self.args["num_chains"]
        k = 3 if is_icl else 5
        hops = min(10, hops) if is_icl else hops
        vars_all = ["".join(rng.choices(string.ascii_uppercase, k=k)).upper() for _ in range((hops + 1) * num_chains)]
        while len(set(vars_all)) < num_chains * (hops + 1):
            vars_all.append("".join(rng.choices(string.ascii_uppercase, k=k)).upper())
        vars_ret, chains = [], []
        for i in range(0, len(vars_all), hops + 1):
            v = vars_all[i:i + hops + 1]
            vars_ret.append(v)
            chain = [f"VAR {v[0]} = 12345" if is_icl else f"VAR {v[0]} = {nprng.randint(10000, 99999)!s}"]
            chain += [f"VAR {v[j + 1]} = VAR {v[j]} " for j in range(hops)]
            chains.append(chain)
        return vars_ret, chains

    @staticmethod
    def _shuffle_sublists_heap(lists, rng):
        import heapq
        heap = [(rng.random(), i, 0) for i in range(len(lists))]
        heapq.heapify(heap)
        out = []
        while heap:
            _, li, ei = heapq.heappop(heap)
            out.append(lists[li][ei])
            if ei + 1 < len(lists[li]):
                heapq.heappush(heap, (rng.random(), li, ei + 1))
        return out

    def _text(self, n, rng, nprng, is_icl: bool, template: str):
        hops = self.args["num_hops"]
        vars_, chains = self._chains(hops, rng, nprng, is_icl)
        value = chains[0][0].split("=")[-1].strip()
        if self.haystack_kind == "essay":
            sents = self.split(" ".join(self.essay[:n]).strip())
            flat = self._shuffle_sublists_heap(chains, rng)
            context = _insert_in_sentences(sents, [c.strip() + "." for c in flat], rng)
        else:
            sentences = [NOISE] * n
            for chain in chains:
                positions = sorted(rng.sample(range(len(sentences)), len(chain)))
                for p, j in zip(positions, range(len(chain))):
                    sentences.insert(p + j, chain[j])
            context = "\n".join(sentences)
        context = context.replace(". \n", ".\n")
        return template.format(context=context, query=value, num_v=hops + 1), vars_[0]

    def make_icl(self, rng, nprng, count) -> None:
        """variable_tracking.py main(): one example at max_seq_length=500 with no generation
        budget, bare template (no model wrapper), 3-letter names and value 12345, sized by the
        same binary search; kept as `input + ' ' + answers + '\\n'`."""
        inc, budget = 50 if self.haystack_kind == "essay" else 5, 500
        probe, _ = self._text(inc, rng, nprng, True, self.bare)
        lo, hi = inc, max(int(budget / (count(probe) / inc) * 3), inc * 2)
        best = None
        while lo <= hi:
            mid = (lo + hi) // 2
            text, _ = self._text(mid, rng, nprng, True, self.bare)
            if count(text) <= budget:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        n = best or inc
        while True:  # RULER's per-sample retry loop, shrinking by `incremental`
            text, answer = self._text(n, rng, nprng, True, self.bare)
            if count(text) <= budget or n <= inc:
                break
            n -= inc
        self.icl = text + " " + " ".join(answer) + "\n"

    def _randomize_icl(self, rng, nprng) -> str:
        icl = self.icl
        for item in icl.strip().split()[-self.args["num_hops"] - 1:]:
            icl = icl.replace(item, "".join(rng.choices(string.ascii_uppercase, k=len(item))).upper())
        return icl.replace("12345", str(nprng.randint(10000, 99999)))

    def build(self, n, rng, nprng, index):
        assert self.icl is not None, "make_icl first"
        text, answer = self._text(n, rng, nprng, False, self.template)
        cut = text.index(TEMPLATES["variable_tracking"]["template"][:20])
        return text[:cut] + self._randomize_icl(rng, nprng) + "\n" + text[cut:], answer


class QA(Generator):
    key, unit = "qa", "documents"

    def __init__(self, args, wrap, seed, cfg, max_seq_length):
        super().__init__(args, wrap, seed, cfg, max_seq_length)
        self.qas, self.docs = data.qa_data(args["dataset"], cfg.get("data_dir"))

    def incremental(self) -> int:
        return 10

    def min_units(self, index):
        return len(self.qas[index]["context"])

    def build(self, n, rng, nprng, index):
        if index >= len(self.qas):
            raise ConfigError(f"RULER qa ({self.args['dataset']}) has {len(self.qas)} questions; "
                              f"lower task.samples_per_task")
        q = self.qas[index]
        cur, more = q["context"], q.get("more_context", [])
        if n < len(cur):
            raise ValueError("fewer documents than the question's own")  # RULER: random.sample fails
        if n < len(self.docs):
            if n - len(cur) > len(more):
                taken = set(cur + more)
                extra = [i for i in range(len(self.docs)) if i not in taken]
                ids = cur + more + rng.sample(extra, max(0, n - len(cur) - len(more)))
            else:
                ids = cur + rng.sample(more, n - len(cur))
            docs = [self.docs[i] for i in ids]
        else:
            docs = (self.docs * ((n + len(self.docs) - 1) // len(self.docs)))[:n]
        random.Random(self.seed).shuffle(docs)
        context = "\n\n".join(DOCUMENT_PROMPT.format(i=i + 1, document=d) for i, d in enumerate(docs))
        return self.template.format(context=context, query=q["query"]), q["outputs"]
