/* Internals shared by tokenizer.c (vocabulary, loaders, decode),
 * tokenizer_bpe.c (pre-tokenizer regexes and rank merges) and
 * tokenizer_spm.c (score merges). Not part of the API. */
#ifndef DSQ_TOKENIZER_INTERNAL_H
#define DSQ_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

/* Token types, numbered as GGUF tokenizer.ggml.token_type (llama.cpp). */
enum {
    DSQ__TT_NORMAL = 1,
    DSQ__TT_UNKNOWN = 2,
    DSQ__TT_CONTROL = 3,
    DSQ__TT_USER = 4,
    DSQ__TT_UNUSED = 5,
    DSQ__TT_BYTE = 6,
};

#define DSQ__MAX_REGEX 8

/* One merge: (left id, right id) -> rank and merged id, open addressing. */
typedef struct dsq__merge {
    int32_t a, b;
    int32_t rank;   /* -1: empty slot */
    int32_t id;
} dsq__merge_t;

struct dsq_tokenizer {
    dsq_tokenizer_kind_t kind;
    int32_t n_vocab;

    /* Vocabulary as stored (byte-level chars for BPE, "▁" for SPM). */
    char **str;
    uint32_t *str_len;
    /* What each token decodes to (bytes). */
    char **dec;
    uint32_t *dec_len;
    float *scores;          /* SPM merge scores, 0 for BPE */
    uint8_t *type;          /* DSQ__TT_* */
    bool *eog;

    /* string -> id, open addressing over str/str_len; -1 empty. */
    int32_t *map;
    uint32_t map_mask;

    dsq__merge_t *merges;
    uint32_t merge_mask;
    int32_t n_merges;

    int32_t bos, eos, unk, pad, eot, eom;
    bool add_bos;
    bool add_space_prefix;   /* SPM dummy prefix */
    bool spm_raw_space;      /* llama2.c vocab: spaces are stored as ' ' */
    bool ignore_merges;      /* llama3: a piece that is a token is kept */
    bool add_prefix_space;   /* HF ByteLevel add_prefix_space */

    int32_t byte_id[256];    /* BPE: token of byte b's char; SPM: <0xNN> */

    /* Pre-tokenizer: regexes applied in sequence (HF Split, Isolated). */
    int n_regex;
    void *regex[DSQ__MAX_REGEX];   /* pcre2_code_8 * */

    /* Specials matched in text (control/user tokens), longest first. */
    int32_t *special;
    int32_t n_special;

    uint8_t special_first[256];  /* 1 if some special starts with byte */

    char *arena_str, *arena_dec;  /* backing store of str[] and dec[] */
    char *chat_template;     /* NUL-terminated copy, or NULL */
};

/* Look a string up in the vocabulary; -1 if absent. */
int32_t dsq__tok_find(const dsq_tokenizer_t *t, const char *s, size_t len);

/* SPM with a dummy prefix: decode drops the first piece's leading space. */
bool dsq__tok_strips_space(const dsq_tokenizer_t *t);

/* Growable id vector used by the encoders. */
typedef struct dsq__ids {
    int32_t *v;
    size_t n, cap;
} dsq__ids_t;
int dsq__ids_push(dsq__ids_t *ids, int32_t id);

/* BPE: compile the pre-tokenizer for a GGUF pre name ("gpt-2",
 * "deepseek-llm", ...). Returns 0, DSQ_EUNSUPPORTED (unknown name) or
 * DSQ_EFORMAT (regex failed to compile; detail in err). */
int dsq__bpe_set_pre(dsq_tokenizer_t *t, const char *pre, char *err,
                     size_t err_len);
/* BPE: append one regex (PCRE2 syntax, UTF-8) to the pre-tokenizer. */
int dsq__bpe_add_regex(dsq_tokenizer_t *t, const char *pattern, char *err,
                       size_t err_len);
/* The GPT-2 ByteLevel regex (HF ByteLevel use_regex=true). */
extern const char dsq__bpe_gpt2_regex[];
/* Build the byte -> unicode mapping tables (idempotent, thread-safe). */
void dsq__bpe_byte_map(uint32_t byte_to_cp[256]);
/* Encode one text fragment (no specials) and append ids. */
int dsq__bpe_encode(const dsq_tokenizer_t *t, const char *text, size_t len,
                    dsq__ids_t *out);
void dsq__bpe_free(dsq_tokenizer_t *t);

/* SPM: encode one fragment; prefix says whether to add the dummy space. */
int dsq__spm_encode(const dsq_tokenizer_t *t, const char *text, size_t len,
                    bool prefix, dsq__ids_t *out);

/* Merge candidate of the BPE (by rank) and SPM (by score) merge loops: the
 * heap pops the lowest key first (BPE: merge rank; SPM: -score), the
 * leftmost on ties. a, b: BPE pair ids / SPM merged id in a; len: SPM
 * merged byte length. */
typedef struct dsq__cand {
    double key;
    int32_t left, a, b;
    size_t len;
} dsq__cand_t;

/* Binary min-heap of candidates; zero-initialise, free(h.v) when done. */
typedef struct dsq__heap {
    dsq__cand_t *v;
    size_t n, cap;
} dsq__heap_t;

/* Returns 0 or DSQ_ENOMEM. */
int dsq__heap_push(dsq__heap_t *h, dsq__cand_t c);
/* Pop the smallest (h->n must be > 0). */
dsq__cand_t dsq__heap_pop(dsq__heap_t *h);

#endif
