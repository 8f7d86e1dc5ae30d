"""Reference tokenizer for Mistral's Tekken (Mistral Small 3.1 / 3.2, the text
encoder of FLUX.2 [dev]), written from tiktoken's published byte-pair
algorithm (openai/tiktoken: ``_educational.py`` and ``src/lib.rs``'s
``byte_pair_merge``) and mistral_common's Tekkenizer layout, not from kiln's
C++. It reads (and ``train`` makes) the vocabulary of an HF ``tokenizer.json``
as transformers' MistralConverter writes one for Tekken.

The layout (mistral_common's Tekkenizer; HF's converted tokenizer.json):

- ids 0 .. NUM_SPECIAL - 1 (1000) are the special tokens: 0 "<unk>", 1 "<s>",
  2 "</s>", 3 "[INST]", 4 "[/INST]", ... 19 "[TOOL_CONTENT]" (SPECIAL_TOKENS),
  then "<SPECIAL_20>" .. "<SPECIAL_999>"; in tokenizer.json they are
  ``added_tokens`` (``special: true``) and also in ``model.vocab``.
- id NUM_SPECIAL + r is the tiktoken token of rank r: ranks 0 .. 255 are the
  single bytes in byte order, then the merged tokens, each the concatenation
  of two tokens of lower rank. In tokenizer.json each token's bytes are
  written in GPT-2's ``bytes_to_unicode`` characters (byte-level BPE).

encode(text):

1. special tokens are cut out of the text first, leftmost first and the
   longest where several start at one place (HF's added-vocabulary matching);
   each becomes its id and is never split;
2. the text between them is split by TEKKEN_PATTERN with the ``regex`` module
   (``regex.findall``: every character lands in one piece);
3. each piece's UTF-8 bytes: if the whole piece is a token, that token
   (tiktoken's encoder lookup; HF's ``ignore_merges``); otherwise tiktoken's
   byte-pair merge: start from single bytes, repeatedly join the adjacent
   pair whose concatenation is the token of the lowest rank (the leftmost
   such pair on ties) until no adjacent pair joins to a token.

No BOS or EOS is added (a chat template's text carries "<s>"), no
normalisation, no prefix space.
"""

import collections
import json

import regex

NUM_SPECIAL = 1000

# Mistral Small 3.1 / 3.2's tekken.json special tokens, ranks 0 .. 19.
SPECIAL_TOKENS = [
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]",
    "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]",
]

# tekken.json's "pattern" (Mistral's tokenizer.json writes the same string in
# its Split pre-tokenizer): letters split by case, digits one by one, a
# punctuation run takes trailing newlines and slashes.
TEKKEN_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
                  r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
                  r"\p{N}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n/]*|"
                  r"\s*[\r\n]+|"
                  r"\s+(?!\S)|"
                  r"\s+")


def special_tokens():
    """The NUM_SPECIAL special tokens in id order."""
    return SPECIAL_TOKENS + ["<SPECIAL_%d>" % i for i in range(len(SPECIAL_TOKENS), NUM_SPECIAL)]


def bytes_to_unicode():
    """GPT-2's byte -> character table: printable Latin-1 bytes map to themselves, the others to
    U+0100 onwards in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


BYTE_ENCODER = bytes_to_unicode()
BYTE_DECODER = {c: b for b, c in BYTE_ENCODER.items()}


def token_string(token_bytes):
    """A token's bytes as tokenizer.json writes it (byte-level characters)."""
    return "".join(BYTE_ENCODER[b] for b in token_bytes)


def token_bytes(string):
    return bytes(BYTE_DECODER[c] for c in string)


def byte_pair_merge(ranks, piece):
    """tiktoken's merge of one piece's bytes: the parts (bytes) it ends with."""
    parts = [bytes([b]) for b in piece]
    while True:
        best, best_rank = None, None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and (best_rank is None or rank < best_rank):  # strict: leftmost on ties
                best, best_rank = i, rank
        if best is None:
            return parts
        parts = parts[:best] + [parts[best] + parts[best + 1]] + parts[best + 2:]


class Tekken:
    """ranks: {token bytes: rank} (ranks 0 .. 255 the single bytes); specials: the special tokens
    in id order (ids 0 .. len - 1; the text tokens start at NUM_SPECIAL)."""

    def __init__(self, ranks, specials=None):
        self.ranks = dict(ranks)
        assert all(self.ranks[bytes([b])] == b for b in range(256)), "ranks 0 .. 255 must be the bytes"
        self.specials = list(specials if specials is not None else special_tokens())
        assert len(self.specials) == NUM_SPECIAL
        self.special_ids = {s: i for i, s in enumerate(self.specials)}
        # Longest first: at one position the alternation takes the longest special token.
        ordered = sorted(self.special_ids, key=lambda s: (-len(s), s))
        self.special_re = regex.compile("|".join(regex.escape(s) for s in ordered))
        self.pattern = regex.compile(TEKKEN_PATTERN)

    @property
    def vocab_size(self):
        return NUM_SPECIAL + len(self.ranks)

    @classmethod
    def from_tokenizer_json(cls, path):
        """The ranks and special tokens of an HF tokenizer.json (Tekken converted by transformers)."""
        with open(path, encoding="utf-8") as f:
            tj = json.load(f)
        specials = [None] * NUM_SPECIAL
        for t in tj["added_tokens"]:
            assert t["special"] and t["id"] < NUM_SPECIAL, t
            specials[t["id"]] = t["content"]
        assert all(s is not None for s in specials)
        ranks = {}
        for string, i in tj["model"]["vocab"].items():
            if i < NUM_SPECIAL:
                assert specials[i] == string, (i, string)
            else:
                ranks[token_bytes(string)] = i - NUM_SPECIAL
        assert sorted(ranks.values()) == list(range(len(ranks)))
        return cls(ranks, specials)

    def split_specials(self, text):
        """[(text, None) or (None, special id)] in order."""
        out, at = [], 0
        for m in self.special_re.finditer(text):
            if m.start() > at:
                out.append((text[at:m.start()], None))
            out.append((None, self.special_ids[m.group(0)]))
            at = m.end()
        if at < len(text):
            out.append((text[at:], None))
        return out

    def pieces(self, text):
        """The pre-tokenizer's pieces of text without special tokens."""
        return self.pattern.findall(text)

    def encode_ordinary(self, text):
        """Ids of text read without special tokens."""
        ids = []
        for piece in self.pieces(text):
            b = piece.encode("utf-8")
            rank = self.ranks.get(b)
            if rank is not None:  # the whole piece is a token (ignore_merges)
                ids.append(NUM_SPECIAL + rank)
            else:
                ids.extend(NUM_SPECIAL + self.ranks[p] for p in byte_pair_merge(self.ranks, b))
        return ids

    def encode(self, text):
        ids = []
        for part, special in self.split_specials(text):
            if special is not None:
                ids.append(special)
            else:
                ids.extend(self.encode_ordinary(part))
        return ids

    def decode(self, ids):
        by_id = {NUM_SPECIAL + r: b for b, r in self.ranks.items()}
        out = b""
        for i in ids:
            out += self.specials[i].encode("utf-8") if i < NUM_SPECIAL else by_id[i]
        return out.decode("utf-8", errors="replace")


def train(texts, merges, specials=None):
    """Byte-level BPE training in tiktoken's way (_educational.bpe_train): the texts (special
    tokens cut out) split by TEKKEN_PATTERN, then `merges` times the most frequent adjacent
    pair of tokens over all pieces (the first counted on ties) becomes the next rank and is
    joined everywhere. A pair whose concatenation is already a token is joined without a new
    rank. Returns {token bytes: rank}."""
    base = Tekken({bytes([b]): b for b in range(256)}, specials)
    words = collections.Counter()
    for text in texts:
        for part, special in base.split_specials(text):
            if special is None:
                words.update(piece.encode("utf-8") for piece in base.pieces(part))
    ranks = dict(base.ranks)
    segmented = [([bytes([b]) for b in w], n) for w, n in sorted(words.items())]
    added = 0
    while added < merges:
        stats = collections.Counter()
        for parts, n in segmented:
            for pair in zip(parts[:-1], parts[1:]):
                stats[pair] += n
        if not stats:
            break
        pair = max(stats, key=lambda p: stats[p])  # max returns the first of equal counts
        joined = pair[0] + pair[1]
        if joined not in ranks:
            ranks[joined] = len(ranks)
            added += 1
        for parts, _ in segmented:
            i = 0
            while i < len(parts) - 1:
                if parts[i] == pair[0] and parts[i + 1] == pair[1]:
                    parts[i:i + 2] = [joined]
                i += 1
    return ranks
