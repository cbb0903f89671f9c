/* Tokenizers: byte-level BPE (GPT-2 style: DeepSeek, Qwen2, SmolLM2,
 * StarCoder, GPT-2, Llama 3) and SentencePiece-style BPE (Llama 2,
 * TinyStories tok512), built from GGUF `tokenizer.ggml.*` metadata, from a
 * Hugging Face tokenizer.json (+ tokenizer_config.json), or from a llama2.c
 * tok*.bin. Exactness is checked against llama.cpp's test vectors.
 *
 * A dsq_tokenizer_t is immutable after creation and safe to use from many
 * threads at once.
 */
#ifndef DSQ_TOKENIZER_H
#define DSQ_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dsq_tokenizer dsq_tokenizer_t;
struct dsq_gguf;

typedef enum dsq_tokenizer_kind {
    DSQ_TOKENIZER_BPE = 0,   /* byte-level BPE, merges by rank             */
    DSQ_TOKENIZER_SPM = 1,   /* SentencePiece-style, merges by score       */
} dsq_tokenizer_kind_t;

/* Flags for dsq_tokenizer_encode. */
#define DSQ_TOK_ADD_BOS        1u  /* prepend BOS (if the vocab has one)     */
#define DSQ_TOK_PARSE_SPECIAL  2u  /* match control/added tokens in text     */

/* Build from GGUF metadata (tokenizer.ggml.model/pre/tokens/scores/
 * token_type/merges/bos/eos/...). Works on vocab-only files. NULL + err. */
dsq_tokenizer_t *dsq_tokenizer_from_gguf(const struct dsq_gguf *g, char *err,
                                         size_t err_len);
/* Build from a HF directory (tokenizer.json, tokenizer_config.json) or a
 * tokenizer.json path. NULL + err. */
dsq_tokenizer_t *dsq_tokenizer_from_hf(const char *path, char *err,
                                       size_t err_len);
/* Build from a llama2.c tok*.bin (SPM-style, scores, byte tokens 3..258). */
dsq_tokenizer_t *dsq_tokenizer_from_llama2c(const char *path, char *err,
                                            size_t err_len);
void dsq_tokenizer_destroy(dsq_tokenizer_t *t);  /* NULL is a no-op */

dsq_tokenizer_kind_t dsq_tokenizer_kind(const dsq_tokenizer_t *t);
int32_t dsq_tokenizer_n_vocab(const dsq_tokenizer_t *t);
int32_t dsq_tokenizer_bos(const dsq_tokenizer_t *t);   /* -1 if none */
int32_t dsq_tokenizer_eos(const dsq_tokenizer_t *t);   /* -1 if none */
bool dsq_tokenizer_add_bos(const dsq_tokenizer_t *t);  /* model wants BOS */
/* True for EOS and other end-of-generation tokens (e.g. <|im_end|>,
 * <|endoftext|>, <｜end▁of▁sentence｜>). */
bool dsq_tokenizer_is_eog(const dsq_tokenizer_t *t, int32_t id);
/* True for control tokens (not printed when decoding with skip_special). */
bool dsq_tokenizer_is_special(const dsq_tokenizer_t *t, int32_t id);

/* Encode len bytes of UTF-8 text. *ids is malloc'd (caller frees) and holds
 * *n_ids ids. Invalid UTF-8 is encoded byte-wise, never rejected.
 * Returns 0, DSQ_ENOMEM or DSQ_EINVAL (NULL args). */
int dsq_tokenizer_encode(const dsq_tokenizer_t *t, const char *text,
                         size_t len, unsigned flags, int32_t **ids,
                         size_t *n_ids);

/* The bytes a token stands for when decoded (byte-level mapping undone,
 * SPM "▁" -> " ", "<0xNN>" -> the byte). Not NUL-terminated. Control tokens
 * give their text. Returns NULL for an id out of range. */
const char *dsq_tokenizer_token_bytes(const dsq_tokenizer_t *t, int32_t id,
                                      size_t *len);
/* The token's vocabulary string as stored (for logprob "tokens"). */
const char *dsq_tokenizer_token_str(const dsq_tokenizer_t *t, int32_t id,
                                    size_t *len);

/* Decode ids to text. *text is malloc'd and NUL-terminated. With
 * skip_special, control tokens are dropped. SPM: a leading space produced by
 * the dummy prefix of the first token is removed when strip_leading is set.
 * Returns 0, DSQ_ERANGE (bad id) or DSQ_ENOMEM. */
int dsq_tokenizer_decode(const dsq_tokenizer_t *t, const int32_t *ids,
                         size_t n_ids, bool skip_special, char **text,
                         size_t *len);

#endif
