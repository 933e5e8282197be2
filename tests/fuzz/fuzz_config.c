/* Fuzz target for the config.json side of the model loader (worker/model/model.c): the
 * input is config.json, next to the model.safetensors of a tiny generated model (1 layer,
 * dim 32, bf16). Invariants (fuzz_model.h): every refusal carries a message; an accepted
 * configuration is consistent (ranges, head and vocabulary divisibility, token ids inside the
 * vocabulary) and the loaded model runs a forward pass. */
#include "fuzz_model.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    model_setup("model.safetensors", "config.json");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    write_file(g_path, data, size);
    check_model();
    return 0;
}
