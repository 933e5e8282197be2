"""A byte-level BPE tokenizer: trained from a corpus, applied, and written as a Hugging Face
`tokenizer.json` of the kind Llama 3 and Qwen2 use (a Split pre-tokenizer with a regex, then
ByteLevel; BPE model with merges; ByteLevel decoder), which chunkgate-worker and the reference
tokenizers load.

The corpus is ASCII, where the regex's \\p{L} and \\p{N} are [A-Za-z] and [0-9]; Python's
`re` has no Unicode classes, so this encoder refuses non-ASCII text rather than split it
differently from the worker.
"""

import collections
import json
import re

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# GPT-2's split pattern without the optional space before a word: spaces are tokens of their
# own, so a word has the same tokens wherever it stands (after a space, at the start of a
# document, or as an answer right after "assistant\n"). Copying a value from a document into the
# answer is then copying the same tokens.
PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d|\p{L}+|\p{N}+|[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# PATTERN with the ASCII meaning of its classes, for Python's re.
PRETOKEN = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d|[A-Za-z]+|[0-9]+|[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")
SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL) + ")")


def bytes_to_unicode():
    """GPT-2's map of the 256 bytes to printable characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()


def pretokens(text):
    if not text.isascii():
        raise ValueError("the corpus encoder handles ASCII only")
    return ["".join(B2U[b] for b in t.encode()) for t in PRETOKEN.findall(text)]


def train(texts, vocab_size):
    """Merges learned from texts until the vocabulary (256 bytes + merges + SPECIAL) has
    vocab_size entries. Ties break on the pair itself, so the result depends on the corpus only."""
    words = collections.Counter()
    for t in texts:
        for part in SPECIAL_RE.split(t):
            if part and part not in SPECIAL:
                words.update(pretokens(part))
    seqs = {w: list(w) for w in words}
    merges = []
    n_merges = vocab_size - 256 - len(SPECIAL)
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for w, s in seqs.items():
        for a, b in zip(s, s[1:]):
            pairs[a, b] += words[w]
            where[a, b].add(w)
    while len(merges) < n_merges and pairs:
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        if pairs[best] < 2:
            break
        merges.append(best)
        a, b = best
        for w in list(where.pop(best, ())):
            s, c = seqs[w], words[w]
            for x, y in zip(s, s[1:]):
                pairs[x, y] -= c
                if pairs[x, y] <= 0:
                    del pairs[x, y]
            out, i = [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
            for x, y in zip(out, out[1:]):
                pairs[x, y] += c
                where[x, y].add(w)
    return merges


class Tokenizer:
    def __init__(self, merges):
        self.merges = [tuple(m) for m in merges]
        self.rank = {m: i for i, m in enumerate(self.merges)}
        vocab = [B2U[b] for b in range(256)] + [a + b for a, b in self.merges]
        self.vocab = {s: i for i, s in enumerate(vocab)}
        for s in SPECIAL:
            self.vocab[s] = len(self.vocab)
        self.inv = {i: s for s, i in self.vocab.items()}
        self.u2b = {c: b for b, c in B2U.items()}
        self.cache = {}

    def __len__(self):
        return len(self.vocab)

    def id(self, special):
        return self.vocab[special]

    def _bpe(self, word):
        got = self.cache.get(word)
        if got is not None:
            return got
        s = list(word)
        while len(s) > 1:
            best = min(((self.rank.get((a, b), 1 << 30), i) for i, (a, b) in
                        enumerate(zip(s, s[1:]))))
            if best[0] == 1 << 30:
                break
            i = best[1]
            s[i:i + 2] = [s[i] + s[i + 1]]
        ids = [self.vocab[p] for p in s]
        self.cache[word] = ids
        return ids

    def encode(self, text):
        """Token ids of text, special tokens matched first (as added tokens are)."""
        ids = []
        for part in SPECIAL_RE.split(text):
            if not part:
                continue
            if part in SPECIAL:
                ids.append(self.vocab[part])
            else:
                for w in pretokens(part):
                    ids.extend(self._bpe(w))
        return ids

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            s = self.inv[int(i)]
            if s in SPECIAL:
                out += s.encode()
            else:
                out += bytes(self.u2b[c] for c in s)
        return out.decode("utf-8", errors="replace")

    def to_json(self):
        """The tokenizer.json document (GPT-2 layout: no normalizer, no BOS)."""
        bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
              "use_regex": False}
        split = {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated",
                 "invert": False}
        return {
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": self.vocab[s], "content": s, "single_word": False,
                              "lstrip": False, "rstrip": False, "normalized": False,
                              "special": True} for s in SPECIAL],
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, bl]},
            "post_processor": dict(bl, trim_offsets=False),
            "decoder": bl,
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {s: i for s, i in self.vocab.items() if s not in SPECIAL},
                      "merges": [a + " " + b for a, b in self.merges]},
        }


def load(path):
    with open(path) as f:
        doc = json.load(f)
    return Tokenizer([m.split(" ") for m in doc["model"]["merges"]])
