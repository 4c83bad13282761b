"""The vocabulary of a GGUF file, tokenizing as llama.cpp does (src/llama-vocab.cpp): its
"llama" form (SentencePiece: pairs merged by score, bytes as <0xXX>) and its "gpt2" form
(byte-level BPE: pre-tokenizer regexes, then merges by rank), with llama.cpp's special
tokens, BOS/EOS and space-prefix rules. Text for training a model of a GGUF file goes
through the vocabulary the file carries, so the ids are those llama.cpp feeds it.

Pure Python over the file's lists: no tensors, no device.
"""

from __future__ import annotations

import heapq

# token types (gguf's TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_SPACE = "\u2581"  # SentencePiece's visible space
# texts llama.cpp treats as control tokens whatever their type says (llama_vocab::impl::load:
# "control-looking token ... its type will be overridden"): end of generation, end of
# message, fill-in-the-middle. (llama.cpp takes the FIM and EOT ones only where the file
# names no id for them; a file that names one types it control anyway.)
_CONTROL_LOOKING = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
                    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
                    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                    "<｜end▁of▁sentence｜>", "[e~[",
                    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                    "<|code_prefix|>", "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                    "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>",
                    "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
                    "<|middle|>", "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", "<|fim_repo|>",
                    "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"}
# BPE pre-tokenizers whose decoded text llama.cpp cleans of spaces before punctuation
_CLEANED = {"default", "gpt-2", "llama3"}

# llama.cpp's pre-tokenizer regexes by tokenizer.ggml.pre (llm_tokenizer_bpe), applied in
# turn: each splits the pieces the one before made, keeping what lies between its matches
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
           r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_TOKENIZERS = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
                r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt-2": (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",),
    "llama3": (_LLAMA3,),
    "qwen2": (_LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}"),),
}
_PRE_ALIASES = {"gpt2": "gpt-2", "llama-bpe": "llama3", "llama-v3": "llama3"}


def _byte_characters() -> list[str]:
    """GPT-2's printable character for each byte (how a byte-level BPE vocabulary stores
    bytes: "Ġ" for a space, "Ċ" for a newline)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(others)) for b in range(256)]


BYTE_CHARACTERS = _byte_characters()  # byte b's character (gguf.ByteTokenizer's vocabulary is these)
_CHAR_BYTES = {c: b for b, c in enumerate(BYTE_CHARACTERS)}


class GGUFTokenizer:
    """A GGUF file's vocabulary (tokenizer.ggml.*): `encode` gives llama.cpp's token ids for
    a text (llama_tokenize), `decode` its text for ids (llama_detokenize)."""

    def __init__(self, model: str, tokens: list[str], types: list[int], scores: list[float] | None = None,
                 merges: list[str] | None = None, pre: str = "default", bos: int | None = None,
                 eos: int | None = None, add_bos: bool | None = None, add_eos: bool | None = None,
                 add_space_prefix: bool | None = None, name: str = "") -> None:
        if model not in ("llama", "gpt2"):
            raise NotImplementedError(f"tokenizer model {model!r}: ggrad reads the 'llama' (SentencePiece) and 'gpt2' "
                                      "(byte-level BPE) vocabularies")
        if len(types) != len(tokens) or (scores is not None and len(scores) != len(tokens)):
            raise ValueError(f"a vocabulary of {len(tokens)} tokens needs as many types and scores")
        self.model, self.tokens, self.types = model, list(tokens), [int(t) for t in types]
        self.scores = [0.0] * len(tokens) if scores is None else [float(s) for s in scores]
        self.ids = {text: i for i, text in enumerate(self.tokens)}  # a repeated text: its last id, as llama.cpp's map
        spm = model == "llama"
        self.pre_name, self.pre = pre, _PRE_ALIASES.get(pre, pre)  # as written; llama.cpp's regexes
        if not spm and self.pre not in _PRE_TOKENIZERS:
            raise NotImplementedError(f"pre-tokenizer {pre!r}: ggrad has llama.cpp's {sorted(_PRE_TOKENIZERS)} "
                                      f"(and {sorted(_PRE_ALIASES)})")
        # llama.cpp's defaults: SentencePiece BOS 1, EOS 2, a BOS added, a space before text;
        # BPE ids 11, no BOS unless the llama3 pre-tokenizer, no space
        self.bos = (1 if spm else 11) if bos is None else int(bos)
        self.eos = (2 if spm else 11) if eos is None else int(eos)
        self.add_bos = (spm or self.pre == "llama3") if add_bos is None else bool(add_bos)
        self.add_eos = False if add_eos is None else bool(add_eos)
        self.add_space_prefix = spm if add_space_prefix is None else bool(add_space_prefix)
        self.merges = list(merges or [])
        self.ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(self.merges):
            split = merge.find(" ", 1)
            if split > 0:  # a repeated merge keeps its first rank (llama.cpp's emplace)
                self.ranks.setdefault((merge[:split], merge[split + 1:]), rank)
        # tokens read as control tokens (left out of decoded text, split out of a text only
        # with parse_special); the texts split out before tokenizing, longest first
        # (tokenizer_st_partition), and those that take the whitespace after them along
        # (llama.cpp gives a model named phi3 Phi-3's right-strip)
        self.control = {i for i, t in enumerate(self.types) if t in (CONTROL, UNKNOWN)} | \
            {self.ids[t] for t in _CONTROL_LOOKING if t in self.ids}
        special = [i for i, t in enumerate(self.types) if (t in (USER_DEFINED,) or i in self.control) and self.tokens[i]]
        self.special = sorted(special, key=lambda i: -len(self.tokens[i].encode()))
        self.rstrip: set[int] = set()
        if "phi-3" in name.lower() or "phi3" in name.lower():
            kept = {self.ids.get(t) for t in ("<unk>", "<s>", "<|endoftext|>")}
            self.rstrip = (set(self.special) | {self.ids.get("</s>")}) - kept - {None}
        self._pre_compiled = None

    @classmethod
    def from_file(cls, path: str) -> GGUFTokenizer:
        """The vocabulary of the GGUF file at `path`."""
        from .gguf_file import read_keys

        keys = read_keys(path, lambda key: key.startswith("tokenizer.ggml.") or key == "general.name",
                         "GGUFTokenizer.from_file")

        def field(key: str, default=None):
            return keys.get(f"tokenizer.ggml.{key}", default)

        tokens = field("tokens")
        if tokens is None:
            raise ValueError(f"{path} has no vocabulary (tokenizer.ggml.tokens)")
        return cls(field("model"), tokens, field("token_type", [NORMAL] * len(tokens)), field("scores"),
                   field("merges"), field("pre", "default"), field("bos_token_id"), field("eos_token_id"),
                   field("add_bos_token"), field("add_eos_token"), field("add_space_prefix"),
                   keys.get("general.name", ""))

    def __len__(self) -> int:
        return len(self.tokens)

    def write(self, writer, vocab_size: int) -> None:
        """The vocabulary's keys into a GGUFWriter (gguf.save_model keeps a model's own
        vocabulary); its size must be the model's."""
        if vocab_size != len(self.tokens):
            raise ValueError(f"the vocabulary has {len(self.tokens)} tokens, the model's embedding {vocab_size} rows")
        writer.add_tokenizer_model(self.model)
        writer.add_token_list(self.tokens)
        writer.add_token_types(self.types)
        if self.model == "llama":
            writer.add_token_scores(self.scores)
        else:
            writer.add_tokenizer_pre(self.pre_name)
            writer.add_token_merges(self.merges)
        writer.add_bos_token_id(self.bos)
        writer.add_eos_token_id(self.eos)
        writer.add_add_bos_token(self.add_bos)
        writer.add_add_eos_token(self.add_eos)
        writer.add_add_space_prefix(self.add_space_prefix)

    # ---- text -> ids ---------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama.cpp's ids for `text`: BOS/EOS where the vocabulary adds them (add_special),
        control tokens written in the text read as such only with parse_special (user-defined
        ones always)."""
        out = [self.bos] if add_special and self.add_bos else []
        prev_special = True
        for piece in self._partition(text, parse_special):
            if isinstance(piece, int):
                out.append(piece)
                prev_special = True
                continue
            if self.model == "llama":
                if self.add_space_prefix and prev_special:
                    piece = " " + piece
                self._spm(piece.replace(" ", _SPACE), out)
            else:
                self._bpe(piece, out)
            prev_special = False
        if add_special and self.add_eos:
            out.append(self.eos)
        return out

    def _partition(self, text: str, parse_special: bool) -> list:
        """The text cut at every special token's text: a list of strings and ids."""
        pieces: list = [text] if text else []
        for i in self.special:
            if not parse_special and i in self.control:
                continue
            word, cut = self.tokens[i], []
            for piece in pieces:
                if isinstance(piece, int) or word not in piece:
                    cut.append(piece)
                    continue
                parts = piece.split(word)
                for j, part in enumerate(parts):
                    if j and i in self.rstrip:
                        part = part.lstrip(" \t\n\v\f\r")
                    if part:
                        cut.append(part)
                    if j < len(parts) - 1:
                        cut.append(i)
            pieces = cut
        return pieces

    def _spm(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_spm_session: characters merged pairwise into tokens, the highest
        score first (ties: the leftmost pair); a symbol left unmerged that is no token goes
        out as its bytes (<0xXX>). (A merge only makes tokens, so llama.cpp's resegment of
        a merged symbol into its halves never runs.)"""
        self._merge(list(text), self._spm_priority, out, bytes_fallback=True)

    def _spm_priority(self, left: str, right: str) -> float | None:
        token = self.ids.get(left + right)
        return None if token is None else -self.scores[token]

    def _bpe_priority(self, left: str, right: str) -> int | None:
        return self.ranks.get((left, right))

    def _merge(self, symbols: list[str], priority, out: list[int], bytes_fallback: bool) -> None:
        """Adjacent symbols merged while a pair has a priority (the lowest first, ties: the
        leftmost), as llama.cpp's two sessions do; then each symbol's token."""
        nxt = list(range(1, len(symbols))) + [-1]
        prv = list(range(-1, len(symbols) - 1))
        queue: list = []

        def bigram(left: int, right: int) -> None:
            if left >= 0 and right >= 0:
                key = priority(symbols[left], symbols[right])
                if key is not None:
                    heapq.heappush(queue, (key, left, symbols[left] + symbols[right], right))

        for i in range(1, len(symbols)):
            bigram(i - 1, i)
        while queue:
            _, left, joined, right = heapq.heappop(queue)
            if not symbols[left] or not symbols[right] or symbols[left] + symbols[right] != joined:
                continue  # a side merged since: stale
            symbols[left], symbols[right] = joined, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            bigram(prv[left], left)
            bigram(left, nxt[left])
        for piece in symbols:
            if not piece:
                continue
            token = self.ids.get(piece)
            if token is not None:
                out.append(token)
            elif bytes_fallback:
                out.extend(self._byte_token(b) for b in piece.encode())
            else:  # llama.cpp looks each byte up alone (only ASCII ones can be texts) and skips the rest
                out.extend(self.ids[chr(b)] for b in piece.encode() if b < 0x80 and chr(b) in self.ids)

    def _byte_token(self, b: int) -> int:
        """byte_to_token: <0xXX>, else the byte itself as a one-character text (ASCII only:
        a lone byte of 0x80 or more is no UTF-8 text, and llama.cpp's lookup fails)."""
        token = self.ids.get(f"<0x{b:02X}>")
        if token is None and b < 0x80:
            token = self.ids.get(chr(b))
        if token is None:
            raise ValueError(f"the vocabulary has no token for byte 0x{b:02X}")
        return token

    def _bpe(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_bpe_session: the pre-tokenizer's words, each in GPT-2's byte
        characters, merged by the merges' rank."""
        for word in self._words(text):
            if self.pre == "llama3" and word in self.ids:  # ignore_merges
                out.append(self.ids[word])
            else:
                self._merge(list(word), self._bpe_priority, out, bytes_fallback=False)

    def _words(self, text: str) -> list[str]:
        if self._pre_compiled is None:
            import regex  # the pre-tokenizers' \p{L} classes

            self._pre_compiled = [regex.compile(p) for p in _PRE_TOKENIZERS[self.pre]]
        pieces = [text]
        for pattern in self._pre_compiled:
            cut = []
            for piece in pieces:
                start = 0
                for m in pattern.finditer(piece):
                    if m.start() > start:
                        cut.append(piece[start:m.start()])
                    if m.end() > m.start():
                        cut.append(m.group())
                    start = m.end()
                if start < len(piece):
                    cut.append(piece[start:])
            pieces = cut
        return ["".join(BYTE_CHARACTERS[b] for b in piece.encode()) for piece in pieces]

    # ---- ids -> text ---------------------------------------------------------------------------
    def decode(self, ids, skip_special: bool = True) -> str:
        """The text of `ids` as llama_detokenize (remove_special false) gives it: control
        and unknown tokens left out (skip_special), the space prefix taken off the first
        token's piece, and a BPE vocabulary's spaces before punctuation and contractions
        cleaned as llama.cpp cleans them."""
        data = bytearray()
        remove_space = self.add_space_prefix
        for n, i in enumerate(int(i) for i in ids):
            if not 0 <= i < len(self.tokens):
                raise IndexError(f"token id {i} is outside the vocabulary of {len(self.tokens)}")
            kind, text = self.types[i], self.tokens[i]
            if n:  # only the first token's piece loses its space, even one that renders nothing
                remove_space = False
            if skip_special and i in self.control:
                continue
            if kind in (CONTROL, UNKNOWN, USER_DEFINED) or i in self.control:
                piece = text.encode()
            elif kind not in (NORMAL, BYTE):  # unused and undefined tokens render nothing
                piece = b""
            elif kind == BYTE:
                piece = bytes([int(text[3:5], 16)]) if self.model == "llama" else bytes([_CHAR_BYTES[text]])
            elif self.model == "llama":
                piece = text.replace(_SPACE, " ").encode()
            else:
                piece = bytes(_CHAR_BYTES[c] for c in text if c in _CHAR_BYTES)
            if remove_space and piece.startswith(b" "):
                piece = piece[1:]
            data += piece
        if self.model == "gpt2" and self.pre in _CLEANED:
            data = _clean_spaces(data)
        return data.decode("utf-8", errors="replace")


def _clean_spaces(text: bytearray) -> bytearray:
    """llama.cpp's clean_spaces passes over detokenized BPE text, byte for byte as its
    in-place loops: " ?", " !", " .", " ," lose the space; a lone apostrophe between spaces
    loses both (the space after it overwritten with NUL, which the next test reads);
    " 's", " 'm", " 're", " 've" lose theirs."""
    out = bytearray(text[:1])
    for i in range(1, len(text)):
        if text[i - 1] == 0x20 and text[i] in b"?!.,":
            out.pop()
        out.append(text[i])
    text, out, i = bytearray(out), bytearray(out[:1]), 1
    while i < len(text):
        x = text[i]
        if x == 0x27 and i + 1 < len(text) and text[i - 1] == 0x20 and text[i + 1] == 0x20:
            out.pop()
            i += 1
            text[i] = 0  # llama.cpp's text[++i] = '\0': the skipped space
        out.append(x)
        i += 1
    text, out = out, bytearray(out[:1])
    for i in range(1, len(text)):
        x = text[i]
        if text[i - 1] == 0x20 and x == 0x27 and i + 1 < len(text):
            after = bytes(text[i + 1:i + 3])
            if after[:1] in (b"s", b"m") or (i + 2 < len(text) and after in (b"re", b"ve")):
                out.pop()
        out.append(x)
    return out
