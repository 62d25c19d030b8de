#!/usr/bin/python3
"""Independent oracles for troupe's SentencePiece and tokenizer.json tokenizers (tests only).

  tokenizer_oracle.py sp DIR        trains two SentencePiece models on Unicode text with Debian's
                                    python3-sentencepiece: DIR/unigram.model and DIR/bpe.model (BPE,
                                    byte_fallback and split digits, as LLaMA-2's)
  tokenizer_oracle.py hf DIR LAYOUT trains a tiny byte-level BPE here (pair counts over the layout's
                                    own pre-tokeniser) and writes DIR/tokenizer.json and
                                    DIR/tokenizer_config.json in the layout of LAYOUT: llama3, bloom
                                    or gpt2 (their normalizer / pre_tokenizer / post_processor /
                                    decoder / added_tokens blocks as the real files have them)
  tokenizer_oracle.py texts FILE SEED   writes a JSON list of Unicode-heavy documents (CJK, emoji,
                                    combining marks, RTL, whitespace runs, digits, special tokens)
  tokenizer_oracle.py encode KIND MODEL TEXTS OUT   writes {"ids": [[...] per text], "eod", "vocab_size",
                                    "decoded"} as JSON: KIND is gptsp / llama2 (python3-sentencepiece;
                                    decoded = decode_ids(ids)) or hf (the BPE below, written from the
                                    file's own vocab, merges and pre-tokeniser, with python3-regex for
                                    the \\p{..} classes)
  tokenizer_oracle.py all DIR SEED  all of the above: DIR/{unigram,bpe}.model, DIR/{llama3,bloom,gpt2}/,
                                    DIR/texts.json and DIR/expected.json ({name: encode's output})

Nothing here shares code with troupe: the BPE is the plain quadratic loop (merge the lowest-ranked
adjacent pair, leftmost first, until none is left), the pre-tokeniser is the `regex` module.
"""
import io
import json
import os
import random
import sys

import regex

# ---- text ----

CJK = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴切热器母"
HIRAGANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをん"
KATAKANA = "アイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲン"
HANGUL = ["한국어", "안녕하세요", "감사합니다", "\u1100\u1161\u11a8", "사랑"]  # the third: conjoining jamo
EMOJI = ["😀", "🎉", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇫🇷", "🤖", "🧪", "✨", "🙂", "🔥🔥🔥"]
COMBINING = ["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "Z\u0351\u036b\u0343", "\u0915\u093f",
             "\u0e01\u0e34\u0e48", "\u05e9\u05c1\u05b8"]
RTL = ["مرحبا بالعالم", "السلام عليكم", "שלום עולם", "עברית", "\u200fملف\u200f", "اللغة العربية", "فارسی"]
LATIN = ["The", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs", "naïve", "café", "Straße", "ÆØÅ",
         "internationalization", "Tokenizer", "BPE", "hello", "world", "über", "façade", "œuvre", "ǅemal",
         "ΑΒΓ", "αβγδ", "Привет", "мир", "Ελληνικά", "हिन्दी", "தமிழ்", "ქართული", "ᏣᎳᎩ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]
CONTRACTIONS = ["don't", "I'LL", "we've", "she'd", "it's", "THEY'RE", "o'clock", "'m", "'ſ"]
DIGITS = ["0", "7", "42", "1234567", "3.14159", "2026-12-02", "٣٤٥", "١٢٣٤", "१२३", "①②", "½", "Ⅻ", "00000000000"]
SPACES = [" ", "  ", "   ", "\t", "\t\t ", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2003", "\u2028",
          "\u0085", "\u200b", "\ufeff", "      "]
PUNCT = [".", ",", "!", "?", "…", "。", "，", "、", "।", "۔", "،", "(", ")", "|", "[", "]", "--", "—", "«»", "„“",
         "#", "@", "$", "%", "&", "*", "\\", "/", "~", "`", "^", "{}", "<>", "\"", "'", ";", ":"]
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<s>", "</s>", "<pad>", "<|endoftext|>",
            "<|reserved_special_token_0|>", "<|start_header_id|>"]


def fragment(rng):
    kind = rng.randrange(12)
    if kind == 0:
        return "".join(rng.choice(CJK) for _ in range(rng.randint(1, 8)))
    if kind == 1:
        return "".join(rng.choice(HIRAGANA + KATAKANA) for _ in range(rng.randint(1, 6)))
    if kind == 2:
        return rng.choice(EMOJI + HANGUL)
    if kind == 3:
        return rng.choice(COMBINING)
    if kind == 4:
        return rng.choice(RTL)
    if kind in (5, 6):
        return rng.choice(LATIN)
    if kind == 7:
        return rng.choice(CONTRACTIONS)
    if kind == 8:
        return rng.choice(DIGITS)
    if kind == 9:
        return rng.choice(SPACES)
    if kind == 10:
        return rng.choice(PUNCT)
    return rng.choice(SPECIALS) if rng.random() < 0.3 else rng.choice(LATIN)


def document(rng, n):
    parts = []
    for _ in range(n):
        parts.append(fragment(rng))
        if rng.random() < 0.6:
            parts.append(" ")
    return "".join(parts)


def corpus(seed, lines):
    rng = random.Random(seed)
    return [document(rng, rng.randint(3, 30)).replace("\n", " ") for _ in range(lines)]


def texts(seed):
    rng = random.Random(seed)
    fixed = [
        "Hello world! The quick brown fox's 12345 tests didn't end\u2014here.",
        "中文分词测试：我们今天去北京。日本語のテキストも。한국어 텍스트.",
        "emoji 👨‍👩‍👧‍👦 and 👍🏽 flags 🇫🇷🏳️‍🌈 done",
        "e\u0301e\u0301 a\u0308 Z\u0351\u036b\u0343 \u0915\u093f\u0924\u093e\u092c",
        "مرحبا بالعالم 123 שלום עולם",
        "   leading spaces\t\ttabs\n\n\nnewlines\r\n  trailing   ",
        "digits 1234567890 ٣٤٥٦ १२३ 3.14159 00000",
        "<|begin_of_text|>special<|end_of_text|> tokens </s><s> inline<|eot_id|>",
        "BLOOM punctuation. , ! ? … 。 ， 、 । ۔ ، (parens) |pipes|",
        "",
        " ",
        "\u3000\u00a0\u2028\u0085x",
        "I'LL we've THEY'RE 'ſ o'clock",
    ]
    return fixed + [document(rng, rng.randint(1, 40)) for _ in range(60)]


# ---- SentencePiece ----

def train_sp(out_dir):
    import sentencepiece as spm
    lines = corpus(7, 3000)
    for name, extra in (("unigram", dict(model_type="unigram", vocab_size=1000)),
                        ("bpe", dict(model_type="bpe", byte_fallback=True, split_digits=True, vocab_size=1400))):
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                                       character_coverage=0.9995, hard_vocab_limit=False, num_threads=1,
                                       minloglevel=2, **extra)
        with open(os.path.join(out_dir, name + ".model"), "wb") as f:
            f.write(model.getvalue())


def encode_sp(model, docs, llama2):
    """Megatron's _GPTSentencePieceTokenizer / _Llama2Tokenizer, over the Python binding."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=model)
    ids = [([sp.bos_id()] if llama2 else []) + sp.encode_as_ids(t) for t in docs]
    return {"ids": ids, "eod": sp.eos_id(), "vocab_size": sp.get_piece_size(),
            "decoded": [sp.decode_ids(i) for i in ids]}


# ---- byte-level BPE ----

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_ENCODER = bytes_to_unicode()
BYTE_DECODER = {c: b for b, c in BYTE_ENCODER.items()}

LLAMA3_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
BLOOM_PATTERN = r" ?[^(\s|[.,!?…。，、।۔،])]+"
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def compile_pattern(p):
    # Oniguruma reads a class nested in a class as a union; so does regex's V1 mode (V0 cannot).
    try:
        return regex.compile(p)
    except regex.error:
        return regex.compile(p, flags=regex.V1)


def isolate(pattern, pieces):
    out = []
    for s in pieces:
        pos = 0
        for m in pattern.finditer(s):
            if m.end() == m.start():
                continue
            if m.start() > pos:
                out.append(s[pos:m.start()])
            out.append(m.group())
            pos = m.end()
        if pos < len(s):
            out.append(s[pos:])
    return out


class PreTokenizer:
    def __init__(self, spec):
        steps = spec["pretokenizers"] if spec.get("type") == "Sequence" else [spec]
        self.steps = []
        for s in steps:
            if s["type"] == "Split":
                assert s["behavior"] == "Isolated" and not s.get("invert")
                p = s["pattern"]
                self.steps.append(("split", compile_pattern(p["Regex"]) if "Regex" in p
                                   else regex.compile(regex.escape(p["String"]))))
            elif s["type"] == "ByteLevel":
                self.steps.append(("bytelevel", s.get("add_prefix_space", False), s.get("use_regex", True)))
            else:
                raise ValueError(s["type"])
        self.gpt2 = regex.compile(GPT2_PATTERN)

    def __call__(self, text):
        pieces = [text]
        for step in self.steps:
            if step[0] == "split":
                pieces = isolate(step[1], pieces)
            else:
                if step[1]:
                    pieces = [p if p.startswith(" ") else " " + p for p in pieces]
                if step[2]:
                    pieces = isolate(self.gpt2, pieces)
        return [p for p in pieces if p]


def train_bpe(words, merges_wanted):
    """Counts of pre-tokenised words -> merges, greedily (most frequent pair, ties by the pair)."""
    vocab = {tuple(BYTE_ENCODER[b] for b in w.encode("utf-8")): c for w, c in words.items()}
    merges = []
    for _ in range(merges_wanted):
        pairs = {}
        for sym, c in vocab.items():
            for a, b in zip(sym, sym[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        new = {}
        for sym, c in vocab.items():
            out, i = [], 0
            while i < len(sym):
                if i + 1 < len(sym) and (sym[i], sym[i + 1]) == best:
                    out.append(sym[i] + sym[i + 1])
                    i += 2
                else:
                    out.append(sym[i])
                    i += 1
            new[tuple(out)] = new.get(tuple(out), 0) + c
        vocab = new
    return merges


def make_hf(out_dir, layout):
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False}
    if layout == "llama3":
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
        decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
        model["ignore_merges"] = True
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                    "<|reserved_special_token_1|>", "<|start_header_id|>", "<|end_header_id|>",
                    "<|reserved_special_token_2|>", "<|eot_id|>"]
        head = []
    elif layout == "bloom":
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": BLOOM_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
        decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}
        del model["byte_fallback"]  # BLOOM's file predates the key
        specials = []
        head = ["<unk>", "<s>", "</s>", "<pad>"]  # in the vocab too, at 0..3
    else:  # gpt2
        pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
        decoder = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
        specials = ["<|endoftext|>"]
        head = []

    pretok = PreTokenizer(pre)
    words = {}
    for line in corpus(11, 300):
        for w in pretok(line):
            words[w] = words.get(w, 0) + 1
    merges = train_bpe(words, 300)
    tokens = head + [BYTE_ENCODER[b] for b in range(256)]
    seen = set(tokens)
    for a, b in merges:
        if a + b not in seen:
            seen.add(a + b)
            tokens.append(a + b)
    vocab = {t: i for i, t in enumerate(tokens)}
    model["vocab"] = vocab
    # The merges' two spellings: "a b" (LLaMA-3's and BLOOM's files) and [a, b] (tokenizers >= 0.20).
    model["merges"] = [[a, b] for a, b in merges] if layout == "gpt2" else [a + " " + b for a, b in merges]

    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(head)]
    added += [{"id": len(tokens) + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
               "normalized": False, "special": True} for i, t in enumerate(specials)]
    if layout == "llama3":
        bos = len(tokens)
        post = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos],
                                                      "tokens": ["<|begin_of_text|>"]}}}]}
        config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                  "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072}
    elif layout == "bloom":
        post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": False}
        config = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
                  "tokenizer_class": "BloomTokenizerFast", "padding_side": "left"}
    else:
        post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
        config = {"bos_token": {"content": "<|endoftext|>", "__type": "AddedToken"},
                  "eos_token": {"content": "<|endoftext|>", "__type": "AddedToken"},
                  "tokenizer_class": "GPT2Tokenizer"}
    doc = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": pre, "post_processor": post, "decoder": decoder, "model": model}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=2)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)


class HfOracle:
    def __init__(self, path):
        folder = path if os.path.isdir(path) else os.path.dirname(path)
        with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
            doc = json.load(f)
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        m = doc["model"]
        self.vocab = m["vocab"]
        self.ranks = {}
        for i, merge in enumerate(m["merges"]):
            a, b = merge.split(" ") if isinstance(merge, str) else merge
            self.ranks[(a, b)] = i
        self.ignore_merges = m.get("ignore_merges", False)
        self.pretok = PreTokenizer(doc["pre_tokenizer"])
        self.added = {t["content"]: t["id"] for t in doc.get("added_tokens", [])}
        self.prefix, self.suffix = [], []
        post = doc.get("post_processor") or {}
        for p in (post["processors"] if post.get("type") == "Sequence" else [post]):
            if p.get("type") == "TemplateProcessing":
                side = self.prefix
                for item in p["single"]:
                    if "Sequence" in item:
                        side = self.suffix
                    else:
                        side.extend(p["special_tokens"][item["SpecialToken"]["id"]]["ids"])
        eos = config["eos_token"]
        self.eos = self.added.get(eos["content"] if isinstance(eos, dict) else eos)
        self.vocab_size = len(set(self.vocab) | set(self.added))  # len(AutoTokenizer)

    def bpe(self, piece):
        sym = [BYTE_ENCODER[b] for b in piece.encode("utf-8")]
        if self.ignore_merges and "".join(sym) in self.vocab:
            return [self.vocab["".join(sym)]]
        while len(sym) > 1:
            best = None
            for i in range(len(sym) - 1):
                r = self.ranks.get((sym[i], sym[i + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            sym[i:i + 2] = [sym[i] + sym[i + 1]]
        return [self.vocab[s] for s in sym]

    def encode(self, text):
        ids = list(self.prefix)
        start = i = 0
        while i < len(text):
            hit = max((t for t in self.added if text.startswith(t, i)), key=len, default=None)
            if hit is None:
                i += 1
                continue
            for p in self.pretok(text[start:i]):
                ids += self.bpe(p)
            ids.append(self.added[hit])
            i += len(hit)
            start = i
        for p in self.pretok(text[start:]):
            ids += self.bpe(p)
        return ids + self.suffix


def encode(kind, model, docs):
    if kind in ("gptsp", "llama2"):
        return encode_sp(model, docs, kind == "llama2")
    oracle = HfOracle(model)
    return {"ids": [oracle.encode(t) for t in docs], "eod": oracle.eos, "vocab_size": oracle.vocab_size}


def main():
    cmd = sys.argv[1]
    if cmd == "sp":
        train_sp(sys.argv[2])
    elif cmd == "hf":
        make_hf(sys.argv[2], sys.argv[3])
    elif cmd == "texts":
        with open(sys.argv[2], "w", encoding="utf-8") as f:
            json.dump(texts(int(sys.argv[3])), f, ensure_ascii=False)
    elif cmd == "encode":
        kind, model, texts_file, out = sys.argv[2:6]
        with open(texts_file, encoding="utf-8") as f:
            docs = json.load(f)
        with open(out, "w") as f:
            json.dump(encode(kind, model, docs), f)
    elif cmd == "all":
        d, seed = sys.argv[2], int(sys.argv[3])
        os.makedirs(d, exist_ok=True)
        train_sp(d)
        for layout in ("llama3", "bloom", "gpt2"):
            make_hf(os.path.join(d, layout), layout)
        docs = texts(seed)
        with open(os.path.join(d, "texts.json"), "w", encoding="utf-8") as f:
            json.dump(docs, f, ensure_ascii=False)
        expected = {"gptsp": encode("gptsp", os.path.join(d, "unigram.model"), docs),
                    "llama2": encode("llama2", os.path.join(d, "bpe.model"), docs)}
        for layout in ("llama3", "bloom", "gpt2"):
            expected[layout] = encode("hf", os.path.join(d, layout), docs)
        with open(os.path.join(d, "expected.json"), "w") as f:
            json.dump(expected, f)
    else:
        raise SystemExit("unknown command " + cmd)


if __name__ == "__main__":
    main()
