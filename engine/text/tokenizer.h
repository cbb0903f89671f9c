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

/* Build from GGUF metadata: tokenizer.ggml.model ("gpt2" = byte-level
 * BPE, "llama" = SPM), .pre (pre-tokenizer name, see tokenizer_bpe.c),
 * .tokens, .scores, .token_type (1 normal, 2 unknown, 3 control,
 * 4 user-defined, 5 unused, 6 byte), .merges ("a b"), .bos/.eos/.unknown/
 * .padding/.eot/.eom_token_id, .add_bos_token, .add_space_prefix, and
 * tokenizer.chat_template. Works on vocab-only files. Everything is copied:
 * g may be closed afterwards. A special id that is -1, or missing (SPM:
 * bos 1, eos 2, unk 0 when the vocab has them), means none. NULL + one
 * line in err (unsupported model, missing tokens/merges, a special id
 * other than -1 that is not below the token count (naming the file, key
 * and value), out of memory). An unknown .pre falls back to the GPT-2
 * split with a warning. */
dsq_tokenizer_t *dsq_tokenizer_from_gguf(const struct dsq_gguf *g, char *err,
                                         size_t err_len);
/* Build from a HF directory (tokenizer.json, optional tokenizer_config.json)
 * or a tokenizer.json path (tokenizer_config.json looked up beside it).
 * Byte-level BPE only: model.vocab, model.merges ("a b" strings or [a, b]
 * pairs), model.ignore_merges, added_tokens (special -> control, else
 * user-defined), pre_tokenizer (Sequence of Split regex/string with
 * behavior Isolated, Digits, ByteLevel). tokenizer_config.json gives
 * add_bos_token, bos/eos/pad/unk_token (string or {content}) and
 * chat_template. NULL + err (unreadable file, bad JSON, SentencePiece-style
 * tokenizer.json, unsupported pre-tokenizer, out of memory). */
dsq_tokenizer_t *dsq_tokenizer_from_hf(const char *path, char *err,
                                       size_t err_len);
/* Build from a llama2.c tok*.bin: int32 max_token_length, then per token
 * float32 score, int32 byte length, bytes (llama2.c tokenizer.py export).
 * Id 0 <unk>, 1 BOS, 2 EOS, "<0xNN>" tokens are byte fallbacks; spaces are
 * stored as ' ' (not U+2581); dummy prefix on, add_bos on. NULL + err. */
dsq_tokenizer_t *dsq_tokenizer_from_llama2c(const char *path, char *err,
                                            size_t err_len);
void dsq_tokenizer_destroy(dsq_tokenizer_t *t);  /* NULL is a no-op */

dsq_tokenizer_kind_t dsq_tokenizer_kind(const dsq_tokenizer_t *t);
int32_t dsq_tokenizer_n_vocab(const dsq_tokenizer_t *t);
int32_t dsq_tokenizer_bos(const dsq_tokenizer_t *t);   /* -1 if none */
int32_t dsq_tokenizer_eos(const dsq_tokenizer_t *t);   /* -1 if none */
/* GGUF tokenizer.ggml.padding_token_id / tokenizer_config.json pad_token;
 * -1 if none */
int32_t dsq_tokenizer_pad(const dsq_tokenizer_t *t);
bool dsq_tokenizer_add_bos(const dsq_tokenizer_t *t);  /* model wants BOS */
/* True for EOS, the GGUF eot/eom ids, and control or user-defined tokens
 * whose text is an end marker (<|im_end|>, <|endoftext|>, <|eot_id|>,
 * <|eom_id|>, <｜end▁of▁sentence｜>, <|EOT|>, <|end_of_text|>,
 * <end_of_turn>, <|end|>, <EOT>). False for ids out of range. */
bool dsq_tokenizer_is_eog(const dsq_tokenizer_t *t, int32_t id);
/* True for control tokens (not printed when decoding with skip_special). */
bool dsq_tokenizer_is_special(const dsq_tokenizer_t *t, int32_t id);
/* Id of the token whose stored string (token_str) is exactly text[0..len),
 * or -1. Use it to resolve stop/special tokens by name ("<|im_end|>"). */
int32_t dsq_tokenizer_find(const dsq_tokenizer_t *t, const char *text,
                           size_t len);
/* Chat template (NUL-terminated, owned by t) from GGUF
 * tokenizer.chat_template or tokenizer_config.json chat_template; NULL if
 * none (llama2.c never has one). */
const char *dsq_tokenizer_chat_template(const dsq_tokenizer_t *t);

/* Encode len bytes of UTF-8 text. *ids is malloc'd (caller frees, non-NULL
 * on success even for 0 ids) and holds *n_ids ids. Invalid UTF-8 is encoded
 * byte-wise, never rejected. User-defined tokens are always matched in the
 * text; control tokens only with DSQ_TOK_PARSE_SPECIAL (leftmost, longest).
 * SPM: a dummy-prefix space is added to the text at the start and after
 * each matched special token when the vocab says add_space_prefix.
 * Returns 0, DSQ_ENOMEM or DSQ_EINVAL (NULL args). */
int dsq_tokenizer_encode(const dsq_tokenizer_t *t, const char *text,
                         size_t len, unsigned flags, int32_t **ids,
                         size_t *n_ids);

/* The bytes a token stands for when decoded (byte-level mapping undone,
 * SPM "▁" -> " ", "<0xNN>" -> the byte). Not NUL-terminated; owned by t.
 * Control and user-defined tokens give their text. Returns NULL for an id
 * out of range. */
const char *dsq_tokenizer_token_bytes(const dsq_tokenizer_t *t, int32_t id,
                                      size_t *len);
/* The token's vocabulary string as stored (for logprob "tokens"); owned by
 * t, NUL-terminated, *len bytes. NULL for an id out of range. */
const char *dsq_tokenizer_token_str(const dsq_tokenizer_t *t, int32_t id,
                                    size_t *len);

/* Decode ids to text. *text is malloc'd and NUL-terminated; *len (may be
 * NULL) gets its length. With skip_special, control tokens are dropped.
 * SPM vocabularies with a dummy prefix (add_space_prefix): the leading
 * space of the first non-control piece is removed, so that
 * decode(encode(s)) == s. The result is raw bytes (not validated as UTF-8).
 * Returns 0, DSQ_EINVAL (NULL args), DSQ_ERANGE (bad id) or DSQ_ENOMEM. */
int dsq_tokenizer_decode(const dsq_tokenizer_t *t, const int32_t *ids,
                         size_t n_ids, bool skip_special, char **text,
                         size_t *len);

#endif
