/*
 * chat_two_turns.c — a two-turn conversation through libkvstash.
 *
 *   chat_two_turns MODEL.gguf [MAX_TOKENS]
 *
 * Creates a ks_chat with a system prompt, sends two user messages and prints
 * each reply with the turn's figures. The second turn's prompt starts with
 * the whole first turn (system prompt, question, reply), which kvstash kept
 * in the KV cache: only the new question is prefilled, and n_cached says how
 * many tokens were reused.
 *
 * Exit status: 0 on success; 1 when a call fails or when the second turn
 * reused nothing (n_cached == 0), which would mean the cache is not working.
 *
 * Build (see README.md here):
 *   cc chat_two_turns.c $(pkg-config --cflags --libs kvstash) -o chat_two_turns
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvstash.h>

static void print_stats(int turn, const ks_turn_stats *st) {
    printf("turn %d: prompt %d tokens, cached %d, new %d, generated %d; "
           "prefill %.1f ms, first token %.1f ms\n",
           turn, st->n_prompt, st->n_cached, st->n_new, st->n_generated, st->prompt_ms,
           st->ttft_ms);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s MODEL.gguf [MAX_TOKENS]\n", argv[0]);
        return 2;
    }
    /* The library and the headers this program was compiled with should agree. */
    printf("libkvstash %s (headers %s)\n", ks_version(), KS_VERSION_STRING);

    /* Every parameter struct starts from its defaults; set only what differs. */
    ks_chat_params p = ks_chat_params_default();
    p.model_path = argv[1];
    p.n_ctx = 1024;
    p.system = "You are a helpful assistant. Answer in one short sentence.";

    char err[256] = "";
    ks_chat *chat = NULL;
    int rc = ks_chat_create(&p, &chat, err, sizeof err);
    if (rc) {
        fprintf(stderr, "ks_chat_create: %s (%s)\n", err, ks_strerror(rc));
        return 1;
    }

    /* Greedy sampling (the default): the same model gives the same replies. */
    ks_gen_params g = ks_gen_params_default();
    g.max_tokens = argc > 2 ? atoi(argv[2]) : 32;

    const char *questions[2] = {"What is a KV cache?", "And why does reusing it save time?"};
    ks_turn_stats st[2];
    int status = 0;
    for (int i = 0; i < 2; i++) {
        char *reply = NULL;
        rc = ks_chat_send(chat, questions[i], &g, &reply, &st[i], err, sizeof err);
        if (rc) {
            fprintf(stderr, "ks_chat_send (turn %d): %s (%s)\n", i + 1, err, ks_strerror(rc));
            status = 1;
            break;
        }
        printf("user: %s\nassistant: %s\n", questions[i], reply);
        print_stats(i + 1, &st[i]);
        free(reply); /* the reply is ours */
    }

    if (status == 0 && st[1].n_cached == 0) {
        fprintf(stderr, "the second turn reused no cached token\n");
        status = 1;
    }
    ks_chat_free(chat);
    return status;
}
