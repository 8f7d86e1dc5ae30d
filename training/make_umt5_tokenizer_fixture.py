#!/usr/bin/python3
"""Trains a small SentencePiece unigram model shaped like umT5's tokenizer
(unigram, byte fallback, nmt_nfkc normalisation, T5's ids: pad 0, eos 1,
unk 2) and records sentencepiece's own ids for a set of texts, for
tests/unit/umt5_tokenizer_test.cpp to compare kiln's T5Tokenizer with.

Run with Debian's python3-sentencepiece:
    /usr/bin/python3 training/make_umt5_tokenizer_fixture.py [--out DIR]

Writes into tests/golden/text/:
  umt5_like_spiece.model  the model (vocabulary 500: 3 specials, the 256
                          byte pieces, the rest learnt from a corpus this
                          script writes)
  umt5_like_ids.json      {"model": ..., "cases": [{"text", "ids", "pieces",
                          "decoded"}, ...]} from SentencePieceProcessor's
                          encode and decode

nmt_nfkc's precompiled charsmap alone is 240 KB, so the model carries the
subset of its rules whose characters all lie in the blocks listed in
RULE_BLOCKS or in the texts (each rule as nmt_nfkc has it, read out of a
model trained with the full map). Every rule that can match inside a text is
therefore kept, and the script checks that the full-map model gives the same
ids for every text.

sentencepiece's training is deterministic here (one thread, no sampling): a
rerun writes the same files.
"""

import argparse
import json
import os
import random
import struct
import tempfile

import sentencepiece as spm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "text")
VOCAB = 500

# Characters whose nmt_nfkc rules the model keeps (besides the texts' own).
RULE_BLOCKS = [
    (0x0000, 0x017F),  # ASCII and its controls, Latin-1, Latin Extended-A
    (0x0300, 0x036F),  # combining diacritics
    (0x2000, 0x209F),  # general punctuation (odd spaces, zero widths), super- and subscripts
    (0x2100, 0x218F),  # letterlike symbols, number forms
    (0x2460, 0x24FF),  # enclosed alphanumerics
    (0x3000, 0x303F),  # CJK symbols and punctuation (ideographic space)
    (0xFB00, 0xFB06),  # Latin ligatures
    (0xFEFF, 0xFEFF),  # zero-width no-break space
    (0xFF00, 0xFFEF),  # full- and halfwidth forms
    (0xFFFD, 0xFFFD),
]

# Texts for the ids: plain words, case, whitespace of every kind, accented
# letters the corpus has (pieces) and has not (bytes), NFKC's compositions
# and compatibility forms, scripts and emoji outside the vocabulary (bytes),
# and special pieces typed as text (never matched).
TEXTS = [
    "a red circle on a blue square",
    "The Quick Brown Fox jumps over the lazy dog.",
    "  leading and   trailing\tspaces\n\nand newlines  ",
    "",
    "   \t\n ",
    "caf\u00e9 cr\u00e8me br\u00fbl\u00e9e, na\u00efve fa\u00e7ade",
    "e\u0301cole and cafe\u0301 (combining accents)",
    "\u00d8resund stra\u00dfe \u00e5ngstr\u00f6m",
    "\u4e1c\u4eac and \u5317\u4eac \u90fd\u5e02",
    "emoji \U0001F3A8\U0001F58C\uFE0F and \U0001F600!",
    "\uff26\uff35\uff2c\uff2c\uff37\uff29\uff24\uff34\uff28 \uff11\uff12\uff13",
    "\ufb01ne \ufb02ower ligatures",
    "x\u00b2 and \u00bd and \u2460 and \u2122",
    "zero\u200bwidth\u200dand\ufeffbom",
    "control\x07chars\x1bhere",
    "no\u00a0break\u3000ideographic\u2003em space",
    "</s> and <pad> and <unk> typed",
    "<0x41> is not a byte piece",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0438 \u043a\u0438\u0440\u0438\u043b\u043b\u0438\u0446\u0430",
    "\ud55c\uad6d\uc5b4 \u0928\u092e\u0938\u094d\u0924\u0947",
    "2024-06-01 12:30, 99.5% off!",
    "mixed caf\u00e9\u4e1c\u4eac\U0001F3A8end",
    "\u2581 the block char itself",
]

WORDS = ("a the red blue green yellow circle square triangle cat dog fox bird house tree river mountain "
         "castle garden painting portrait photo of on in under over with and small large bright dark old "
         "new quick brown lazy jumps runs sits sleeps flies swims light shadow sky cloud sun moon star "
         "city street window door table chair book lamp flower leaf stone water fire wind snow rain "
         "morning evening night day detailed realistic style art oil canvas sketch color colour").split()
ACCENTED = ("caf\u00e9 cr\u00e8me br\u00fbl\u00e9e na\u00efve fa\u00e7ade d\u00e9j\u00e0 \u00fcber "
            "r\u00e9sum\u00e9 pi\u00f1ata ni\u00f1o se\u00f1or").split()


def log(msg):
    print(msg, flush=True)


def write_corpus(path):
    rng = random.Random(1234)
    lines = []
    for _ in range(3000):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words) + 1), rng.choice(ACCENTED))
        if rng.random() < 0.3:
            words[0] = words[0].capitalize()
        line = " ".join(words)
        if rng.random() < 0.3:
            line += rng.choice([".", ",", "!", "?", " 1", " 2024", " 42%"])
        lines.append(line)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def train(corpus, prefix, **normalization):
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=prefix, model_type="unigram", vocab_size=VOCAB, byte_fallback=True,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, num_threads=1, input_sentence_size=0,
        shuffle_input_sentence=False, minloglevel=2, **normalization)
    with open(prefix + ".model", "rb") as f:
        return f.read()


# ---- the few protobuf fields needed: ModelProto.normalizer_spec (3).precompiled_charsmap (2) ----

def varint(data, pos):
    value, shift = 0, 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, pos


def fields(data):
    """(field number, wire type, value) of a serialized message; length-delimited values as bytes."""
    pos = 0
    while pos < len(data):
        key, pos = varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = varint(data, pos)
            value, pos = data[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError("wire type %d" % wire)
        yield number, wire, value


def precompiled_charsmap(model):
    for number, _, spec in fields(model):
        if number == 3:
            for n, _, value in fields(spec):
                if n == 2:
                    return value
    raise ValueError("no precompiled charsmap")


def charsmap_rules(blob):
    """Every (key, replacement) of a precompiled charsmap: a uint32 trie size,
    a Darts-clone double array over the keys' UTF-8 bytes, then the
    replacements, NUL-terminated, at the offsets the leaves hold."""
    (size,) = struct.unpack_from("<I", blob, 0)
    units = struct.unpack_from("<%dI" % (size // 4), blob, 4)
    strings = blob[4 + size:]

    def offset(u):
        return (u >> 10) << ((u & (1 << 9)) >> 6)

    rules = {}
    stack = [(offset(units[0]), b"")]
    while stack:
        base, key = stack.pop()
        for c in range(1, 256):
            pos = base ^ c
            if pos >= len(units) or units[pos] & ((1 << 31) | 0xFF) != c:
                continue
            child = pos ^ offset(units[pos])
            if (units[pos] >> 8) & 1:
                start = units[child] & ((1 << 31) - 1)
                rules[key + bytes([c])] = strings[start:strings.index(b"\0", start)]
            stack.append((child, key + bytes([c])))
    return rules


def kept(key, characters):
    return all(any(lo <= ord(ch) <= hi for lo, hi in RULE_BLOCKS) or ch in characters for ch in key)


def rule_tsv(rules, characters):
    lines = []
    for key, value in sorted(rules.items()):
        key, value = key.decode("utf-8"), value.decode("utf-8")
        if kept(key, characters):
            lines.append(" ".join("%X" % ord(ch) for ch in key) + "\t" + " ".join("%X" % ord(ch) for ch in value))
    return "\n".join(lines) + "\n", len(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="fixture folder (default tests/golden/text)")
    args = ap.parse_args()
    args.out = os.path.abspath(args.out)
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        # Relative paths: the model records its training input's and rules' paths.
        os.chdir(tmp)
        corpus = "corpus.txt"
        write_corpus(corpus)
        full = train(corpus, "full", normalization_rule_name="nmt_nfkc")
        rules = charsmap_rules(precompiled_charsmap(full))
        characters = set("".join(TEXTS))
        with open(corpus, encoding="utf-8") as f:
            characters |= set(f.read())
        tsv, count = rule_tsv(rules, characters)
        log("nmt_nfkc: %d rules, %d kept" % (len(rules), count))
        tsv_path = "nmt_nfkc_subset.tsv"
        with open(tsv_path, "w", encoding="utf-8") as f:
            f.write(tsv)
        model = train(corpus, "umt5_like", normalization_rule_tsv=tsv_path)
        os.chdir(cwd)

    full_sp = spm.SentencePieceProcessor(model_proto=full)
    sp = spm.SentencePieceProcessor(model_proto=model)
    assert sp.get_piece_size() == VOCAB and sp.pad_id() == 0 and sp.eos_id() == 1 and sp.unk_id() == 2
    cases = []
    byte_fallback_seen = False
    for text in TEXTS:
        ids = sp.encode(text)
        assert ids == full_sp.encode(text), "the subset of nmt_nfkc changed the ids of %r" % text
        byte_fallback_seen |= any(sp.is_byte(i) for i in ids)
        cases.append({"text": text, "ids": ids, "pieces": [sp.id_to_piece(i) for i in ids],
                      "decoded": sp.decode(ids)})
    assert byte_fallback_seen

    os.makedirs(args.out, exist_ok=True)
    model_path = os.path.join(args.out, "umt5_like_spiece.model")
    with open(model_path, "wb") as f:
        f.write(model)
    ids_path = os.path.join(args.out, "umt5_like_ids.json")
    with open(ids_path, "w", encoding="utf-8") as f:
        json.dump({"model": "umt5_like_spiece.model", "generator": "training/make_umt5_tokenizer_fixture.py",
                   "sentencepiece": spm.__version__, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    for path in (model_path, ids_path):
        log("wrote %s: %.1f KB" % (os.path.relpath(path, ROOT), os.path.getsize(path) / 1e3))
    assert os.path.getsize(model_path) < 100_000, "the model must stay small"


if __name__ == "__main__":
    main()
