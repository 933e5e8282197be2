# cg_tokenizer: Hugging Face tokenizer.json tokenizers and the byte tokenizer of the tiny model
# (worker/model/tokenizer.c). Regexes on PCRE2, Unicode normalization from utf8proc.
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
add_library(cg_tokenizer STATIC ${CMAKE_CURRENT_LIST_DIR}/tokenizer.c)
target_link_libraries(cg_tokenizer PUBLIC cg_cache PkgConfig::PCRE2 PkgConfig::UTF8PROC
                      PkgConfig::JANSSON PkgConfig::XXHASH Threads::Threads)
