/* The C API used from C (not C++): load the tiny golden model, generate two
 * images with a progress callback, save one, read its parameters back, and
 * check that a bad request fails with a message and the context stays usable. */
#include <stdio.h>
#include <string.h>

#include "kiln.h"

static int steps_seen = 0;
static void on_progress(int image, int step, int steps, void* user_data) {
    (void)image;
    (void)steps;
    (void)user_data;
    if (step > 0) steps_seen++;
}

#define CHECK(cond, ...)                           \
    do {                                           \
        if (!(cond)) {                             \
            fprintf(stderr, "FAIL: " __VA_ARGS__); \
            fprintf(stderr, "\n");                 \
            return 1;                              \
        }                                          \
    } while (0)

int main(int argc, char** argv) {
    CHECK(argc == 4, "usage: c_api_smoke MODEL TOKENIZER OUT.png");
    kiln_set_log_level(KILN_LOG_WARN);
    kiln_context_params cp;
    kiln_context_params_init(&cp);
    cp.model_path = argv[1];
    cp.tokenizer_path = argv[2];
    cp.n_threads = 1;
    char* error = NULL;
    kiln_context* ctx = NULL;
    kiln_context_create(&cp, &ctx, &error);
    CHECK(ctx != NULL, "create: %s", error ? error : "?");

    kiln_generation_params gp;
    kiln_generation_params_init(&gp);
    gp.prompt = "a red circle";
    gp.width = 32;
    gp.height = 32;
    gp.steps = 2;
    gp.batch_count = 2;
    gp.progress = on_progress;
    kiln_image* images = NULL;
    int n = 0;
    CHECK(kiln_generate(ctx, &gp, &images, &n, &error) == 0, "generate: %s", error ? error : "?");
    CHECK(n == 2 && images[0].width == 32 && images[0].height == 32 && images[0].channels == 3, "image shape");
    CHECK(steps_seen == 4, "progress callback saw %d steps, expected 4", steps_seen);
    CHECK(images[0].parameters && strstr(images[0].parameters, "Seed: 42,"), "parameters");
    CHECK(images[1].parameters && strstr(images[1].parameters, "Seed: 43,"), "second seed");
    CHECK(kiln_image_save(&images[0], argv[3], &error) == 0, "save: %s", error ? error : "?");
    kiln_images_free(images, n);

    char* text = NULL;
    CHECK(kiln_image_read_parameters(argv[3], &text, &error) == 0, "read parameters: %s", error ? error : "?");
    CHECK(strncmp(text, "a red circle\n", 13) == 0, "parameters text: %s", text);
    kiln_free_string(text);

    gp.width = 30; /* not a multiple of the model's stride */
    CHECK(kiln_generate(ctx, &gp, &images, &n, &error) != 0, "bad width accepted");
    CHECK(error && strstr(error, "multiples of"), "error message: %s", error ? error : "(none)");
    CHECK(images == NULL && n == 0, "no partial result");
    kiln_free_string(error);
    error = NULL;

    gp.width = 32;
    gp.batch_count = 1;
    CHECK(kiln_generate(ctx, &gp, &images, &n, &error) == 0, "context unusable after an error: %s",
          error ? error : "?");
    kiln_images_free(images, n);
    kiln_context_free(ctx);
    printf("c_api_smoke: ok (%s)\n", kiln_version());
    return 0;
}
