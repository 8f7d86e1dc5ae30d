"""A CLIP-format byte-level BPE vocabulary built from the caption words.

Vocabulary (id = index), in CLIP's own order:
  0..255     the 256 byte-level characters (bytes_to_unicode order)
  256..511   the same with "</w>"
  512..      one token per merge, in merge order
  last two   "<|startoftext|>", "<|endoftext|>"

Merges are built word by word: the word is run through the BPE built so far,
then the pieces are joined left to right with new merges (ranks after every
earlier merge), so each caption word ends as one token ("red</w>") and no
earlier word changes. ``encode`` is OpenAI CLIP's simple_tokenizer algorithm
(lower-case, whitespace clean-up, CLIP's pre-tokenisation regex restricted to
ASCII, "</w>" on the last symbol, lowest-rank pair first), which is what kiln's
ClipTokenizer::from_tokens_and_merges does with tokenizer.ggml.tokens/merges.
"""

import re

CONTEXT = 77


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def get_pairs(word):
    return set(zip(word[:-1], word[1:]))


def bpe(token, ranks):
    """OpenAI CLIP's bpe(): token is the byte-unicode string of one piece."""
    word = tuple(token[:-1]) + (token[-1] + "</w>",)
    pairs = get_pairs(word)
    if not pairs:
        return [token + "</w>"]
    while True:
        bigram = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if bigram not in ranks:
            break
        first, second = bigram
        new_word = []
        i = 0
        while i < len(word):
            try:
                j = word.index(first, i)
                new_word.extend(word[i:j])
                i = j
            except ValueError:
                new_word.extend(word[i:])
                break
            if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                new_word.append(first + second)
                i += 2
            else:
                new_word.append(word[i])
                i += 1
        word = tuple(new_word)
        if len(word) == 1:
            break
        pairs = get_pairs(word)
    return list(word)


def build(words):
    """(tokens, merges) for a list of words."""
    byte_chars = list(bytes_to_unicode().values())
    merges = []
    ranks = {}
    b2u = bytes_to_unicode()
    for w in words:
        u = "".join(b2u[b] for b in w.encode("utf-8"))
        pieces = bpe(u, ranks)
        while len(pieces) > 1:
            pair = (pieces[0], pieces[1])
            if pair not in ranks:
                ranks[pair] = len(merges)
                merges.append(pair)
            pieces = [pieces[0] + pieces[1]] + pieces[2:]
        assert bpe(u, ranks) == [u + "</w>"], w
    tokens = byte_chars + [c + "</w>" for c in byte_chars]
    seen = set(tokens)
    for a, b in merges:
        t = a + b
        assert t not in seen, t
        seen.add(t)
        tokens.append(t)
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    return tokens, [a + " " + b for a, b in merges]


# CLIP's pattern, ASCII classes (captions are ASCII).
PAT = re.compile(r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[a-z]+|[0-9]|[^\sa-z0-9]+",
                 re.IGNORECASE)


class Tokenizer:
    def __init__(self, tokens, merges):
        self.tokens = list(tokens)
        self.merges = list(merges)
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.ranks = {tuple(m.split(" ")): i for i, m in enumerate(self.merges)}
        self.bos = self.ids["<|startoftext|>"]
        self.eos = self.ids["<|endoftext|>"]
        self.b2u = bytes_to_unicode()

    @classmethod
    def from_words(cls, words):
        return cls(*build(words))

    def encode(self, text):
        text = re.sub(r"\s+", " ", text).strip().lower()
        ids = []
        for piece in PAT.findall(text):
            u = "".join(self.b2u[b] for b in piece.encode("utf-8"))
            for t in bpe(u, self.ranks):
                ids.append(self.ids.get(t, self.eos))
        return ids

    def __call__(self, text, context=CONTEXT):
        """SD1 layout: BOS, ids (truncated to context - 2), EOS, EOS padding."""
        ids = self.encode(text)[: context - 2]
        row = [self.bos] + ids + [self.eos]
        return row + [self.eos] * (context - len(row))


def default():
    from shapes_dataset import all_words

    return Tokenizer.from_words(all_words())


if __name__ == "__main__":
    tok = default()
    print("vocab %d, merges %d" % (len(tok.tokens), len(tok.merges)))
    for text in ("a red circle on a white background", "A  Purple STAR", ""):
        ids = tok(text)
        n = ids.index(tok.eos) + 1
        print(repr(text), ids[:n], [tok.tokens[i] for i in ids[:n]])
