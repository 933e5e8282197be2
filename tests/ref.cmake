# The independent torch reference of the HF forward pass (tests/ref/hf_forward.py): its
# self-test runs with Debian's /usr/bin/python3 (python3-torch, python3-numpy) and exits 77,
# reported as skipped with the reason, when those are missing. With the worker built it also
# loads the generate-model presets.
set(CG_REF_PY_ENV OMP_NUM_THREADS=2)
if(TARGET chunkgate-worker)
  list(APPEND CG_REF_PY_ENV "CHUNKGATE_WORKER_BIN=$<TARGET_FILE:chunkgate-worker>")
endif()
add_test(NAME ref_hf_forward
  COMMAND sh -c "if [ -x /usr/bin/python3 ]; then exec /usr/bin/python3 \"$0\"; fi; echo 'SKIP: /usr/bin/python3 is missing'; exit 77"
          ${CMAKE_CURRENT_SOURCE_DIR}/ref/test_hf_forward.py)
set_tests_properties(ref_hf_forward PROPERTIES ENVIRONMENT "${CG_REF_PY_ENV}"
  SKIP_RETURN_CODE 77 TIMEOUT 300)

# The C worker against that reference over HTTP (tests/ref/test_worker_parity.py): prompt
# log-probabilities and top-20 lists of random-weight checkpoints of every supported
# architecture within 1e-2, and the chunk-reuse deviation measured. Needs the worker, torch and
# `npm ci` in tests/ref (the pinned tokenizers); skipped with the reason otherwise.
add_test(NAME ref_worker_parity
  COMMAND sh -c "if [ -x /usr/bin/python3 ]; then exec /usr/bin/python3 \"$0\"; fi; echo 'SKIP: /usr/bin/python3 is missing'; exit 77"
          ${CMAKE_CURRENT_SOURCE_DIR}/ref/test_worker_parity.py)
set_tests_properties(ref_worker_parity PROPERTIES ENVIRONMENT "${CG_REF_PY_ENV}"
  SKIP_RETURN_CODE 77 TIMEOUT 300)

# The training recipe (train/, tests/ref/test_train_recipe.py): three steps of training, then the
# checkpoint in the worker against the recipe's tokenizer, @lenml/tokenizers and the torch
# reference. Needs the worker and torch; skipped with the reason otherwise.
add_test(NAME ref_train_recipe
  COMMAND sh -c "if [ -x /usr/bin/python3 ]; then exec /usr/bin/python3 \"$0\"; fi; echo 'SKIP: /usr/bin/python3 is missing'; exit 77"
          ${CMAKE_CURRENT_SOURCE_DIR}/ref/test_train_recipe.py)
set_tests_properties(ref_train_recipe PROPERTIES ENVIRONMENT "${CG_REF_PY_ENV};OPENBLAS_NUM_THREADS=1"
  SKIP_RETURN_CODE 77 TIMEOUT 300)

# The same reference against llama.cpp (node-llama-cpp's prebuilt CPU binaries) on the presets
# converted to GGUF: skipped unless torch, node and both npm folders are installed.
if(TARGET chunkgate-worker)
  add_test(NAME ref_llamacpp
    COMMAND ${PROJECT_SOURCE_DIR}/bench/llamacpp/crosscheck_test.sh $<TARGET_FILE:chunkgate-worker>)
  set_tests_properties(ref_llamacpp PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
    ENVIRONMENT "NODE_LLAMA_CPP_SKIP_DOWNLOAD=true;OMP_NUM_THREADS=2")
endif()

# Real-model checks end to end (tests/ref/test_models_e2e.mjs): the worker and the gateway on
# the architecture presets with the real tokenizer files, against @lenml/tokenizers and
# @huggingface/jinja: /tokenize and /detokenize, chat rendering with the documents in the
# system message, reuse on the real tokenizer. Skipped without node or tests/ref's packages.
if(TARGET chunkgate-worker AND TARGET chunkgate)
  add_test(NAME ref_models_e2e
    COMMAND sh -c "command -v node >/dev/null || { echo 'SKIP: node is missing'; exit 77; }; exec node \"$0\" \"$1\" \"$2\""
            ${CMAKE_CURRENT_SOURCE_DIR}/ref/test_models_e2e.mjs
            $<TARGET_FILE:chunkgate-worker> $<TARGET_FILE:chunkgate>)
  set_tests_properties(ref_models_e2e PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()
