/* Fuzz target for the safetensors reader and the model loader (worker/model/
 * safetensors.c, model.c): the input is model.safetensors, next to the valid config.json of a
 * tiny generated model (1 layer, dim 32). Invariants (fuzz_model.h): a file the reader accepts
 * has a header that says exactly what the reader returns (names, dtypes, shapes, offsets inside
 * the data section, no overlaps) and tensor bytes equal to the file's; a model the loader
 * accepts is consistent and runs a forward pass; a refusal carries a message. */
#include "fuzz_model.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    model_setup("config.json", "model.safetensors");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    write_file(g_path, data, size);
    check_safetensors(g_path, data, size);
    check_model();
    return 0;
}
