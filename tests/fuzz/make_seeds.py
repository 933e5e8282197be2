#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/.

Deterministic: running it again rewrites the same files. The model seeds (config.json and
model.safetensors of the tiny model the model targets load) come from the generator itself:
pass --model-dir DIR holding them (scripts/fuzz.sh --seeds does: CG_FUZZ_SEED_OUT=DIR makes
fuzz_replay_config write them). Crash reproducers are added by hand as crash-<target>-<what>
and are never rewritten here."""
import argparse
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- fuzz_split: [sep][max_segments][max_segment_bytes][flags][custom sep][prompt]
def split_seeds():
    def s(name, prompt, sel=0, ms=0xFF, mb=0, flags=0, custom=b""):
        if isinstance(prompt, str):
            prompt = prompt.encode()
        write("split", name, bytes([sel, ms, mb, flags]) + custom + prompt)

    s("rag", "You are a careful assistant. # # <doc A> # # <doc B> # # What changed in 2024?")
    s("no_separator", "Just a plain question without any separator?")
    s("one_segment", "# # hello")
    s("two_segments", "system part # # question")
    s("empty_segments", "sys # #   # #\t\n# # chunk # # # # q")
    s("whitespace_kinds", " \t\v\f\r\n sys \r\n# #\f chunk \v# #\t q \n")
    s("adjacent_overlap", "a # ## # b # # # c", 0)
    s("sep_edges", "# # a # # b # #")
    s("utf8_mixed", "系统提示 # # 文档一：数据 # # 😀 emoji ✓ # # Frage: Größe?")
    s("utf8_long_cjk", ("中文文本" * 40 + " # # ") * 3 + "问题？")
    s("utf8_invalid_overlong", b"sys # # \xc0\x80 # # q")
    s("utf8_invalid_surrogate", b"sys # # \xed\xa0\x80 # # q")
    s("utf8_invalid_too_large", b"sys # # \xf4\x90\x80\x80 # # q")
    s("utf8_truncated_end", b"sys # # chunk # # q \xe2\x82")
    s("utf8_invalid_unchecked", b"sys # # \xff\xfe # # q", flags=1)
    s("utf8_block_boundary", b"a" * 63 + b"\xe2\x82\xac" + b" # # " + b"b" * 60 + b"\xf0\x9f\x98\x80")
    s("too_many_segments", "a # # b # # c # # d", ms=3)
    s("segment_too_large", "short # # this segment is longer than eight # # q", mb=8)
    s("defaults_params_null", "x # # y # # z", flags=2)
    s("reuse_result", "x # # y # # z", flags=4)
    s("sep_blank_lines", "system\n\ndoc one\n\n\n\ndoc two\n\nquestion", sel=3)
    s("sep_self_overlap", "x aaa y aaaa z aa w", sel=4)
    s("sep_aba", "1 ababa 2 aba 3", sel=5)
    s("sep_space", "  one two  three ", sel=7)
    s("sep_utf8", "système é doc é question", sel=8)
    s("sep_32_bytes", "sys 0123456789abcdef0123456789abcdef doc 0123456789abcdef0123456789abcdef q", sel=10)
    s("sep_33_bytes_memmem", "sys 0123456789abcdef0123456789abcdefX q", sel=11)
    s("sep_40_lt_memmem", "sys " + "<" * 41 + " doc " + "<" * 80 + " q", sel=12)
    s("custom_sep", "sys ||| doc ||| q", sel=0xC0 | 2, custom=b"|||")
    s("custom_sep_nul", "sys # # q", sel=0xC0 | 1, custom=b"\x00x")
    s("many_segments", " # # ".join("seg%d" % i for i in range(300)), ms=0x80)


# ---- fuzz_chat: [sep][max_segments][max_segment_bytes][flags][text_max][fields 0xFF-separated]
def chat_seeds():
    def c(name, fields, sel=0, ms=0x80, mb=0, flags=0, tmax=0, custom=b""):
        body = b"\xff".join(bytes([k]) + (v.encode() if isinstance(v, str) else v) for k, v in fields)
        write("chat", name, bytes([sel, ms, mb, flags, tmax]) + custom + body)

    SYS, DEV, USER, ASSIST, TOOL, CUSTOM, NULLC, DOC = 1, 2, 3, 4, 5, 6, 7, 0
    c("rag_user", [(SYS, "You are helpful."), (USER, "doc A # # doc B # # What is new?")])
    c("documents", [(SYS, "Answer from the documents."), (DOC, "Doc one text."),
                    (DOC, "Doc two text."), (USER, "Summarise.")])
    c("documents_only", [(DOC, "only a document"), (USER, "q?")])
    c("multi_turn", [(SYS, "sys # # shared doc"), (USER, "first # # turn one"),
                     (ASSIST, "answer one"), (USER, "turn two # # doc # # final")])
    c("developer_role", [(DEV, "dev rules # # dev doc"), (USER, "hi # # there")])
    c("tool_and_null", [(SYS, "s # # d"), (ASSIST, b""), (NULLC, b""), (TOOL, "tool output")])
    c("custom_role", [(SYS, "s # # d"), (CUSTOM, b"critic\xfecontent # # x")])
    c("custom_role_with_sep", [(SYS, "s # # d"), (CUSTOM, b"a # # b\xfetext")])
    c("custom_role_empty", [(SYS, "s # # d"), (CUSTOM, b"\xfetext")])
    c("no_separator_passthrough", [(SYS, "plain"), (USER, "plain question")])
    c("empty_documents", [(DOC, ""), (DOC, "  \n "), (USER, "q")])
    c("empty_parts", [(SYS, "# #  # # s"), (USER, " # # # # q # #")])
    c("invalid_utf8_doc", [(DOC, b"bad \xc3\x28 bytes"), (USER, "q")])
    c("invalid_utf8_unchecked", [(DOC, b"bad \xc3\x28 bytes"), (USER, "q")], flags=1)
    c("sep_newline_pads", [(SYS, "s\nd"), (USER, "a\nb")], sel=2)
    c("sep_all_pads", [(SYS, "s \n\t\r\f\v d"), (USER, "q")], sel=4)
    c("sep_user_colon", [(SYS, "s user: d"), (USER, "q")], sel=8)
    c("sep_double_colon", [(SYS, "s :: d"), (USER, "q::r")], sel=7)
    c("text_max_small", [(SYS, "system text # # document text"), (USER, "question")], flags=2, tmax=4)
    c("too_many_segments", [(SYS, "a # # b # # c"), (USER, "d # # e")], ms=3)
    c("segment_size", [(SYS, "tiny # # a much longer document"), (USER, "q")], mb=10)
    c("unicode", [(SYS, "Système # # 文档 😀"), (USER, "Größe? # # ✓")])
    c("custom_sep", [(SYS, "s <> d"), (USER, "q")], sel=0xC0 | 1, custom=b"<>")


# ---- fuzz_chat_template: [flags][template]: the templates of the chat-template parity cases
def chat_template_seeds():
    spec = json.load(open(os.path.join(HERE, "..", "data", "chat_template_cases.json"), encoding="utf-8"))
    srcs = [(t["name"], t["template"]) for t in spec["templates"] if "template" in t]
    srcs += [(f["name"], f["template"]) for f in spec["features"]]
    for i, (name, src) in enumerate(srcs):
        write("chat_template", name, bytes([i % 8]) + src.encode())


# ---- fuzz_sse: [caps][seed][stream]
def sse_seeds():
    def e(name, stream, caps=0, seed=7):
        if isinstance(stream, str):
            stream = stream.encode()
        write("sse", name, bytes([caps, seed]) + stream)

    openai = ('data: {"id":"cmpl-1","object":"text_completion","choices":[{"text":"Hel","index":0}]}\n\n'
              'data: {"id":"cmpl-1","object":"text_completion","choices":[{"text":"lo","index":0,'
              '"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
              'data: [DONE]\n\n')
    e("openai_lf", openai)
    e("openai_lf_bytewise", openai, seed=0)
    e("openai_crlf", openai.replace("\n", "\r\n"), seed=3)
    e("openai_cr", openai.replace("\n", "\r"), seed=5)
    e("crlf_bytewise", "data: a\r\n\r\ndata: b\r\n\r\n", seed=0)
    e("chat_chunks", 'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'
                     'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\ndata: [DONE]\n\n', seed=11)
    e("fields", "event: update\nid: 42\nretry: 1500\ndata: line one\ndata: line two\n\n", seed=2)
    e("comments", ": keep-alive\n\n: another\ndata: x\n\n", seed=9)
    e("no_colon_field", "data\n\ndata:\n\ndata:  two spaces\n\n")
    e("unknown_fields", "foo: bar\nevent\ndata: y\nid\n\n")
    e("bom", b"\xef\xbb\xbfdata: after bom\n\n", seed=1)
    e("bom_partial", b"\xef\xbbdata: not a bom\n\n", seed=1)
    e("bom_only", b"\xef\xbb", seed=1)
    e("unfinished_block", "data: complete\n\ndata: cut off")
    e("blank_lines_only", "\n\n\r\n\r\r\n")
    e("retry_values", "retry: 00000000000000000000000012\n\nretry: 9223372036854775799\n\n"
                      "retry: 9223372036854775800\n\nretry: 12a\n\nretry:\n\n")
    e("id_with_nul", b"id: a\x00b\ndata: x\n\nid: ok\ndata: y\n\n")
    e("line_cap_small", "data: this line is longer than sixteen bytes\n\n", caps=0x02)
    e("event_cap_small", "data: 0123456789\ndata: 0123456789\ndata: 0123456789\n\n", caps=0x10)
    e("event_cap_exact_crlf", "data: 12345678901234567890123\r\n\r\n", caps=0x10, seed=0)
    e("utf8_payload", 'data: {"text":"héllo 世界 😀"}\n\n')
    e("split_crlf_at_boundary", "data: a\r\n\r\ndata: b\r\r\ndata: c\n\r\n", seed=1)


# ---- fuzz_json_request: the body bytes
def json_seeds():
    def j(name, obj):
        write("json_request", name, obj if isinstance(obj, (str, bytes)) else json.dumps(obj))

    j("completion_rag", {"model": "m", "prompt": "sys # # doc A # # doc B # # question?", "max_tokens": 16})
    j("completion_stream", {"model": "m", "prompt": "s # # q", "stream": True, "max_tokens": 4})
    j("completion_prompt_array", {"model": "m", "prompt": ["s # # d # # q"]})
    j("completion_prompt_array_two", {"model": "m", "prompt": ["a", "b"]})
    j("completion_token_ids", {"model": "m", "prompt": [[1, 2, 3]]})
    j("completion_separator", {"model": "m", "prompt": "s || d || q", "chunk_separator": "||"})
    j("completion_separator_empty", {"model": "m", "prompt": "s # # q", "chunk_separator": ""})
    j("completion_mode_sys", {"model": "m", "prompt": "s # # d # # q", "chunk_mode": "sys",
                              "cache_salt": "tenant-a"})
    j("completion_mode_bad", {"model": "m", "prompt": "s # # q", "chunk_mode": "loose"})
    j("completion_documents", {"model": "m", "prompt": "q", "documents": ["d"]})
    j("completion_nul_escapes", '{"model":"m\\u0000x","prompt":"a\\u0000 # # b","cache_salt":"s\\u0000t"}')
    j("chat_rag", {"model": "m", "messages": [{"role": "system", "content": "You help."},
                                             {"role": "user", "content": "doc # # question"}]})
    j("chat_documents", {"model": "m", "documents": ["Doc one.", "Doc two # # part"],
                         "messages": [{"role": "user", "content": "Summarise."}],
                         "max_completion_tokens": 32})
    j("chat_content_parts", {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "part one # # doc"}, {"type": "text", "text": "part two"}]}]})
    j("chat_image_part", {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}, {"type": "text", "text": "a # # b"}]}]})
    j("chat_tool_calls", {"model": "m", "messages": [
        {"role": "system", "content": "s # # d"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        {"role": "tool", "content": "result"}, {"role": "user", "content": "next"}]})
    j("chat_bad_types", {"model": "m", "messages": [{"role": 5, "content": "x"}], "stream": "yes"})
    j("chat_empty_messages", {"model": "m", "messages": []})
    j("chat_documents_not_strings", {"model": "m", "messages": [{"role": "user", "content": "q"}],
                                     "documents": [1, None]})
    j("lookup_keys", {"keys": ["0123456789abcdef0123456789abcdef", "0123456789ABCDEF0123456789ABCDEF"]})
    j("lookup_bad_key", {"keys": ["xyz", 5]})
    j("numbers", {"model": "m", "prompt": "a # # b", "max_tokens": 16.0, "temperature": 1e300,
                  "top_p": -0.0, "n": 9223372036854775807})
    j("max_tokens_huge_real", '{"model":"m","prompt":"a # # b","max_tokens":1e300}')
    j("max_tokens_nan_like", '{"model":"m","prompt":"a # # b","max_tokens":-1e19}')
    j("invalid_json", '{"model": "m", "prompt": ')
    j("not_object", '["model", "prompt"]')
    j("invalid_utf8", b'{"model":"m","prompt":"\xc3\x28 # # q"}')
    j("empty_model", {"model": "", "prompt": "a # # b"})
    j("many_segments", {"model": "m", "prompt": " # # ".join("s%d" % i for i in range(300))})
    # upstream answers, for cg_gw_to_chat
    j("answer_completion", {"id": "cmpl-abc", "object": "text_completion", "created": 1, "model": "m",
                            "choices": [{"text": "Hello", "index": 0, "finish_reason": "stop",
                                         "logprobs": None}],
                            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})
    j("answer_chunk_odd", {"id": "x" * 200, "choices": [{"text": ""}, 5, {"text": None}]})
    # pass-through bodies the fast path's scan takes (and some it must leave alone)
    j("fast_plain", '{"model":"m","prompt":"Plain question, no separator.","max_tokens":16,'
                    '"temperature":0.5,"stop":["\\n","END"],"user":"u-1","stream":false}')
    j("fast_prompt_array", ' { "model" : "m" , "prompt" : [ "one string" ] , "max_tokens" : null } ')
    j("fast_escapes", '{"model":"m","prompt":"tab\\there \\u00e9 \\"quoted\\"","seed":-0,"top_p":0.25}')
    j("fast_surrogates", '{"model":"m","prompt":"\\ud83d\\ude00 pair","x":"\\udc00"}')
    j("fast_duplicate_top", '{"model":"m","prompt":"a","model":"n"}')
    j("fast_nested", '{"model":"m","prompt":"a","stream_options":{"include_usage":true}}')
    j("fast_numbers", '{"model":"m","prompt":"a","a":123456789012345678,"b":1234567890123456789,'
                      '"c":1.5e3,"d":-0.000,"e":01}')


# ---- fuzz_kvwire: [mode][bytes]
def kvwire_body(model=b"chunkgate-tiny", layers=1, hd=4, dtype=0, tokens=2, start=0, heads=1, total=2,
                pad=0, version=1, payload_fix=0):
    need = 42 + len(model)
    hb = (need + 7) // 8 * 8
    h = b"CGKV" + struct.pack("<IIH", version, hb, len(model)) + model
    h += struct.pack("<7I", layers, hd, dtype, tokens, start, heads, total)
    h += bytes([pad]) * (hb - need) if hb > need else b""
    n = heads * layers * 2 * tokens * hd
    payload = b"".join(struct.pack("<f", 0.25 * i - 1.0) for i in range(n))
    return h + payload[: len(payload) + payload_fix] if payload_fix < 0 else h + payload + b"\0" * payload_fix


def kvwire_seeds():
    def k(name, mode, data):
        write("kvwire", name, bytes([mode]) + (data.encode() if isinstance(data, str) else data))

    k("valid_1layer", 0, kvwire_body())
    k("valid_2layers_heads_1_2", 0, kvwire_body(model=b"m", layers=2, hd=8, tokens=3, start=1, heads=2, total=4))
    k("valid_misaligned", 1, kvwire_body())
    k("truncated", 0, kvwire_body(payload_fix=-4))
    k("trailing", 0, kvwire_body(payload_fix=4))
    k("bad_magic", 0, b"CGKX" + kvwire_body()[4:])
    k("version_2", 0, kvwire_body(version=2))
    k("dtype_f16", 0, kvwire_body(dtype=1))
    k("nonzero_padding", 0, kvwire_body(model=b"abc", pad=1))
    k("model_control_char", 0, kvwire_body(model=b"a\nb"))
    k("heads_out_of_range", 0, kvwire_body(start=1, heads=2, total=2))
    k("zero_tokens", 0, kvwire_body(tokens=0))
    k("header_only", 0, kvwire_body()[:56])
    for i, (total, s) in enumerate([(8, "0-3"), (8, "5"), (8, "3-2"), (8, ""), (8, "8"),
                                    (0xFFFFFFFF, "4294967294"), (8, "00000000001"), (8, "1-"),
                                    (8, "-1"), (0, "0"), (8, "1-2-3"), (8, "01234567890")]):
        k("heads_%02d" % i, 2, struct.pack("<I", total) + s.encode())
    k("head_key_ok", 3, struct.pack("<IB", 3, 200) + b"chunkgate-tiny\xff" + b"0123456789abcdef" * 2)
    k("head_key_short_cap", 3, struct.pack("<IB", 3, 20) + b"m\xff" + b"0123456789abcdef" * 2)
    k("head_key_upper_hex", 3, struct.pack("<IB", 0, 100) + b"m\xff" + b"0123456789ABCDEF" * 2)


# ---- fuzz_disk: [flags][op, off u16, len, bytes]...
def disk_seeds():
    def d(name, flags, ops):
        b = bytes([flags])
        for op, off, data in ops:
            b += struct.pack("<BHB", op, off, len(data)) + data
        write("disk", name, b)

    d("no_edit", 0, [])
    d("reopen_only", 1, [])
    d("flip_one_byte", 0, [(1, 10, b"\x01")])
    d("overwrite_block", 0, [(0, 256, b"\xaa" * 64)])
    d("same_bytes", 0, [(0, 0, b"")])
    d("xor_across_slots", 0, [(1, 250, bytes(range(1, 17)))])
    d("truncate_half", 0, [(2, 3000, b"")])
    d("truncate_reopen", 1, [(2, 700, b"")])
    d("many_edits", 0, [(1, i * 397, b"\x80") for i in range(16)])
    d("forge_free_slots", 0, [(3, 5, bytes(range(16)) + bytes([20, 21]))])
    d("forge_out_of_range", 0, [(3, 5, bytes(range(16)) + bytes([27, 26]))])
    d("forge_overlap", 0, [(3, 2, bytes(range(16)) + bytes([0]))])
    d("forge_victim_sum", 0, [(3, 0x400 | 3, bytes(range(3, 19)))])
    d("forge_victim_sum_slots", 0, [(3, 0x400 | 0x800, bytes(range(5, 21)))])
    d("forge_wrong_model", 0, [(3, 0x200, bytes(range(16)) + bytes([22]))])
    d("forge_slot_count", 0, [(3, 0x100 | 3, bytes(range(16)) + bytes([22]))])
    d("forge_and_edit", 0, [(3, 7, bytes(range(16)) + bytes([20, 21])), (1, 5120, b"\xff\xff")])


# ---- fuzz_safetensors and fuzz_config
def st_file(tensors, data=b"", meta=True, raw_header=None, hl=None):
    hdr = {"__metadata__": {"format": "pt"}} if meta else {}
    hdr.update(tensors)
    text = raw_header if raw_header is not None else json.dumps(hdr, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text) if hl is None else hl) + text + data


def model_seeds(model_dir):
    st = lambda name, data: write("safetensors", name, data)
    f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.0)
    st("one_f32", st_file({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, f32))
    st("f16_bf16", st_file({"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]},
                            "b": {"dtype": "BF16", "shape": [2], "data_offsets": [4, 8]}}, b"\x00\x3c\x00\xc0\x80\x3f\x00\x40"))
    st("other_dtypes", st_file({"i": {"dtype": "I8", "shape": [4], "data_offsets": [0, 4]},
                                "f8": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [4, 8]}}, b"\x01" * 8))
    st("zero_dim_and_empty", st_file({"s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
                                      "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [4, 4]}}, f32[:4]))
    st("overlap", st_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, f32))
    st("beyond_end", st_file({"a": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, f32))
    st("unknown_dtype", st_file({"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, f32))
    st("metadata_only", st_file({}))
    st("header_len_huge", st_file({}, hl=1 << 40))
    st("header_not_json", st_file({}, raw_header=b"{not json"))
    st("header_array", st_file({}, raw_header=b"[1,2]"))
    st("short_file", b"\x08\x00\x00")
    if model_dir:
        with open(os.path.join(model_dir, "model.safetensors"), "rb") as fp:
            st("tiny_model_bf16", fp.read())
        with open(os.path.join(model_dir, "config.json"), "rb") as fp:
            cfg_text = fp.read()
        write("config", "tiny_model", cfg_text)
        base = json.loads(cfg_text)

        def cv(name, **changes):
            c = dict(base)
            for k, v in changes.items():
                if v is None and k.startswith("drop_"):
                    c.pop(k[5:], None)
                else:
                    c[k] = v
            write("config", name, json.dumps(c, indent=1))

        cv("rope_scaling", rope_scaling={"rope_type": "yarn", "factor": 4.0})
        cv("interleaved", rope_style="interleaved")
        cv("rope_style_bad", rope_style=3)
        cv("no_head_dim", drop_head_dim=None)
        cv("gqa_2_1", num_attention_heads=2, num_key_value_heads=1, head_dim=16)
        cv("tied", tie_word_embeddings=True)
        cv("bos_array", bos_token_id=[256, 1], eos_token_id=[257])
        cv("bos_outside", bos_token_id=300)
        cv("max_pos_1", max_position_embeddings=1)
        cv("bias", attention_bias=True)
        cv("missing_hidden", drop_hidden_size=None)
        cv("float_sizes", hidden_size=32.0)
        cv("huge_dims", hidden_size=65536, intermediate_size=1 << 20, vocab_size=1 << 24)
        cv("model_id_long", model_id="m" * 200, _name_or_path="")
        cv("eps_zero", rms_norm_eps=0)
        write("config", "not_json", b"{\"hidden_size\": 32,")
        write("config", "empty", b"")

# ---- fuzz_http_frame: [max_target][max_header_bytes/4][(max_head-16)/8][max_headers][max_body/16]
#      [seed][bytes a client sent]
def http_frame_seeds():
    def h(name, raw, limits=(63, 0, 255, 15, 0), seed=7):
        if isinstance(raw, str):
            raw = raw.encode("latin-1")
        write("http_frame", name, bytes(limits) + bytes([seed]) + raw)

    H = "Host: x\r\n"
    h("get", "GET / HTTP/1.1\r\n" + H + "\r\n")
    h("bare_lf", "GET / HTTP/1.1\n" + H + "\n")
    h("http10_close", "GET / HTTP/1.0\r\n\r\ngarbage")
    h("keep_alive_10", "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET / HTTP/1.0\r\n\r\n")
    h("content_length", "POST /v1/completions HTTP/1.1\r\n" + H + "Content-Length: 5\r\n\r\nhello")
    h("chunked", "POST / HTTP/1.1\r\n" + H + "Transfer-Encoding: chunked\r\n\r\n"
      "5;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n")
    h("pipelined", "GET /1 HTTP/1.1\r\n" + H + "\r\nPOST /2 HTTP/1.1\r\n" + H +
      "Content-Length: 2\r\n\r\n{}GET /3 HTTP/1.1\r\n" + H + "Connection: close\r\n\r\n\x00")
    h("cl_malformed", "POST / HTTP/1.1\r\n" + H + "Content-Length: -1\r\n\r\n")
    h("cl_conflict", "POST / HTTP/1.1\r\n" + H + "Content-Length: 1\r\nContent-Length: 2\r\n\r\nab")
    h("cl_and_te", "POST / HTTP/1.1\r\n" + H + "Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n")
    h("te_gzip", "POST / HTTP/1.1\r\n" + H + "Transfer-Encoding: gzip, chunked\r\n\r\n")
    # whitespace after a framing value: libmicrohttpd frames it otherwise, so it is refused
    h("te_trailing_space", "POST / HTTP/1.1\r\n" + H + "Transfer-Encoding: chunked \r\n\r\n"
      "2\r\n{}\r\n0\r\n\r\nGET / HTTP/1.1\r\n" + H + "\r\n")
    h("te_trailing_tab", "POST / HTTP/1.1\r\n" + H + "Transfer-Encoding: chunked\t\r\n\r\n0\r\n\r\n")
    h("cl_trailing_space", "POST / HTTP/1.1\r\n" + H + "Content-Length: 2 \r\n\r\n{}")
    h("chunk_huge", "POST / HTTP/1.1\r\n" + H + "Transfer-Encoding: chunked\r\n\r\nfffffffffff\r\nab",
      limits=(63, 0, 255, 15, 64))
    h("chunk_bad", "POST / HTTP/1.1\r\n" + H + "Transfer-Encoding: chunked\r\n\r\nzz\r\n")
    h("obs_fold", "GET / HTTP/1.1\r\n" + H + "X-A: a\r\n b\r\n\r\n")
    h("space_colon", "GET / HTTP/1.1\r\n" + H + "X-A : a\r\n\r\n")
    h("no_host", "GET / HTTP/1.1\r\n\r\n")
    h("http2", "GET / HTTP/2.0\r\n" + H + "\r\n")
    h("long_target", "GET /" + "a" * 80 + " HTTP/1.1\r\n" + H + "\r\n", limits=(40, 0, 255, 15, 0))
    h("many_headers", "GET / HTTP/1.1\r\n" + H + "".join("X-%d: v\r\n" % i for i in range(20)) + "\r\n",
      limits=(63, 0, 255, 8, 0))
    h("header_bytes", "GET / HTTP/1.1\r\n" + H + "X-Pad: " + "p" * 60 + "  \r\n\r\n",
      limits=(63, 16, 255, 15, 0))
    h("cr_alone", "GET / HTTP/1.1\r\n" + H + "X-A: a\rb\r\n\r\n")
    h("split_crlf_end", "POST / HTTP/1.1\r\n" + H + "Transfer-Encoding: chunked\r\n\r\n1\r\nx\r", seed=1)
    # inputs on which the target's reference once disagreed (a CR pending at the end)
    h("pending_cr_head_end", "GET /1 HTTP/1.1\r\n" + H + "\r\nPOST /D2 HTTP/1.1\r\n" + H +
      "Content-Length: 2\r\n\r", limits=(63, 0, 255, 15, 0))
    h("pending_cr_empty_line", "\r\n\r", limits=(255, 255, 255, 11, 0), seed=0)


# ---- fuzz_gguf: a one-layer llama of dim 32 with a byte-level BPE vocabulary (written by
# bench/gguf_write.py's Writer: numpy), then damaged copies of it
def gguf_seeds():
    import sys
    import tempfile
    sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
    import numpy as np
    import gguf_write as gw

    sys.path.insert(0, os.path.join(HERE, "..", "..", "train"))
    import bpe
    alphabet = [bpe.B2U[b] for b in range(256)]  # GPT-2's byte-level alphabet
    tokens = alphabet + ["ab", "<|endoftext|>"]
    types = [gw.TOK_NORMAL] * 257 + [gw.TOK_CONTROL]
    V, D, F, H, KV, HD = len(tokens), 32, 64, 4, 2, 8
    rng = np.random.RandomState(7)

    def model(gtype, **over):
        w = gw.Writer()
        w.add("general.architecture", gw.T_STRING, "llama")
        w.add("general.name", gw.T_STRING, "fuzz-gguf")
        for k, v in (("context_length", 256), ("embedding_length", D), ("block_count", 1),
                     ("feed_forward_length", F), ("attention.head_count", H),
                     ("attention.head_count_kv", KV), ("rope.dimension_count", HD)):
            w.add("llama." + k, gw.T_UINT32, over.get(k, v))
        w.add("llama.attention.layer_norm_rms_epsilon", gw.T_FLOAT32, 1e-5)
        w.add("llama.rope.freq_base", gw.T_FLOAT32, 10000.0)
        w.add("tokenizer.ggml.model", gw.T_STRING, over.get("tok_model", "gpt2"))
        w.add("tokenizer.ggml.pre", gw.T_STRING, over.get("pre", "default"))
        w.add_array("tokenizer.ggml.tokens", gw.T_STRING, tokens)
        w.add_array("tokenizer.ggml.token_type", gw.T_INT32, types)
        w.add_array("tokenizer.ggml.merges", gw.T_STRING, ["a b"])
        w.add("tokenizer.ggml.eos_token_id", gw.T_UINT32, V - 1)
        w.add("tokenizer.chat_template", gw.T_STRING,
              "{% for m in messages %}{{ m['content'] }}\n{% endfor %}")

        def mat(rows, cols):
            x = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
            if gtype == gw.GGML_Q8_0:
                return lambda: gw.quant_q8_0(x)
            return lambda: x.astype(np.float16)

        def vec(k):
            x = np.ones(k, np.float32)
            return lambda: x
        w.add_tensor("token_embd.weight", gtype, [V, D], mat(V, D))
        w.add_tensor("blk.0.attn_norm.weight", gw.GGML_F32, [D], vec(D))
        for name, r, c in (("attn_q", H * HD, D), ("attn_k", KV * HD, D), ("attn_v", KV * HD, D),
                           ("attn_output", D, H * HD), ("ffn_gate", F, D), ("ffn_up", F, D),
                           ("ffn_down", D, F)):
            w.add_tensor("blk.0.%s.weight" % name, gtype, [r, c], mat(r, c))
        w.add_tensor("blk.0.ffn_norm.weight", gw.GGML_F32, [D], vec(D))
        w.add_tensor("output_norm.weight", gw.GGML_F32, [D], vec(D))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.gguf")
            w.write(path)
            with open(path, "rb") as f:
                return f.read()

    g = lambda name, data: write("gguf", name, data)
    f16 = model(gw.GGML_F16)
    g("valid_f16", f16)
    g("valid_q8_0", model(gw.GGML_Q8_0))
    g("pre_qwen2", model(gw.GGML_F16, pre="qwen2"))
    g("pre_unknown", model(gw.GGML_F16, pre="falcon"))
    g("tokenizer_spm", model(gw.GGML_F16, tok_model="llama"))
    g("partial_rotary", model(gw.GGML_F16, **{"rope.dimension_count": 4}))
    g("cut_in_data", f16[:len(f16) - 100])
    g("cut_in_header", f16[:600])
    g("bad_magic", b"GGML" + f16[4:256])
    g("version_4", f16[:4] + struct.pack("<I", 4) + f16[8:256])
    g("huge_counts", f16[:8] + struct.pack("<QQ", 1 << 40, 1 << 40) + f16[24:256])
    # the first tensor info's type field -> 14 (Q6_K): after the metadata, name, dims
    name = b"token_embd.weight"
    i = f16.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    g("type_q6_k", f16[:i + 4 + 16] + struct.pack("<I", 14) + f16[i + 24:])
    g("type_unknown", f16[:i + 4 + 16] + struct.pack("<I", 200) + f16[i + 24:])
    g("dims_5", f16[:i] + struct.pack("<I", 5) + f16[i + 4:])


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model-dir", help="directory with the generated config.json and model.safetensors")
    a = ap.parse_args()
    split_seeds()
    chat_seeds()
    sse_seeds()
    json_seeds()
    kvwire_seeds()
    disk_seeds()
    chat_template_seeds()
    http_frame_seeds()
    model_seeds(a.model_dir)
    gguf_seeds()


if __name__ == "__main__":
    main()
