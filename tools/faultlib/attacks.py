"""The table of attacks, in the report's order."""

from __future__ import annotations

from faultlib.chat import chat_mask_flips, chat_records, chat_templates
from faultlib.chat_trust import foreign_answers, spelled_specials, template_bombs
from faultlib.common import Attack
from faultlib.cursors import cursors, text_cursors
from faultlib.edges import arrow_edges, bound_edges, option_edges, state_edges, writer_edges
from faultlib.flips import flips, index_edits
from faultlib.holdout import holdout_kills, holdout_leftovers
from faultlib.holdout_edges import (
    holdout_fractions,
    holdout_readers,
    holdout_remote,
    shard_sizing,
)
from faultlib.inputs import bad_records, record_bombs, special_inputs, truncated_zst
from faultlib.mixture import mixture_steps, spec_files
from faultlib.packs import concurrent_packs, failed_shard_write, killed_packs
from faultlib.quarantine import quarantined_rows
from faultlib.records import arrow_inputs, masked_records
from faultlib.rows import bucketed_tokens, shard_url_openings, shuffled_short_sample
from faultlib.servers import cache_files, hostile_servers, lying_servers
from faultlib.states import hostile_states
from faultlib.storage import fifo_shard, interrupted_pack
from faultlib.tables import (
    cache_tables,
    commitments,
    head_edits,
    table_flips,
    table_lies,
    worker_remap,
)
from faultlib.travel import (
    kwargs_resumes,
    recorded_kwargs,
    template_kwargs,
    tiktoken_given,
    tokenizer_paths,
)
from faultlib.trust import (
    missing_sidecars,
    spec_names_and_weights,
    state_downgrades,
    stored_mask_targets,
    token_ids,
)
from faultlib.writer import python_writer

ATTACKS = [
    Attack("bit flip in sample bytes (.tar)", "1 random bit inside a sample's msgpack bytes, whole epoch read", flips("sample", 350, 1)),
    Attack("bit flip in sample bytes, 2 workers", "as above, the epoch read by 2 torch workers (each verifies the samples it copies, at the copy)", flips("sample", 100, 4, num_workers=2)),
    Attack("bit flip in sample bytes, 2 workers, document windows", "as above with `return_doc_boundaries=True` (decoded windows, verified in the read-ahead)", flips("sample", 50, 5, num_workers=2, return_doc_boundaries=True)),
    Attack("bit flip anywhere in a .tar", "1 random bit anywhere (headers, padding, data)", flips("tar", 100, 2)),
    Attack("bit flip in a sidecar (.idx)", "1 random bit anywhere in the sidecar", flips("idx", 150, 3)),
    Attack("edited index.json", "14 edits (counts, duplicates, swaps, inf/NaN, names leaving the root, ...), Loader and `verify`", index_edits),
    Attack("hostile cursor", "one field of a saved state (global and streams orders) replaced by a hostile JSON value; an accepted state must continue the uninterrupted run (recorded once; past the recording, the global order's random access of a loader that never saw the edit) from some step", cursors),
    Attack("truncated .zst input", "a .zst cut at random points (blocks flushed every 4 KB), with and without --on-error skip", truncated_zst),
    Attack("bad JSON records", "surrogate, deep nesting, huge int, not JSON, no text field; strict and --on-error skip", bad_records),
    Attack("FIFO in place of a shard", "a named pipe where a shard should be", fifo_shard),
    Attack("interrupted pack, then read", "index.json missing, journal present: Loader and `stats`", interrupted_pack),
    Attack("pack killed (SIGKILL), rerun", "killed after n shards appeared; the rerun must be byte-identical to an uninterrupted pack", killed_packs),
    Attack("special files as pack inputs", "a FIFO named, in a folder, matched by a glob; /dev/zero; a Unix socket: refused naming the path before any work", special_inputs),
    Attack("record bombs in pack inputs", "one 64 MiB line in a few KB of .zst/.gz, plain, and a whole .txt.zst, under --max-record-bytes 1MiB; strict and --on-error skip", record_bombs),
    Attack("shard write fails, rerun", "a directory where shard k must go: a clear error, then (removed) a byte-identical rerun", failed_shard_write),
    Attack("two packs into one output", "started together: one wins, the other is refused naming it, output identical", concurrent_packs),
    Attack("hostile HTTP servers", "1 byte / 0.5 s, 503 forever, every body cut, accept-and-never-answer, 501 on PUT", hostile_servers),
    Attack("raw-text cursor edits", "every field of both raw-text cursors (saved after 7 batches, 2 streams) moved by -2..+2, then 40 hostile values; accepted only if the next batches are the recorded uninterrupted run's from some step", text_cursors),
    Attack("mixture and one-dataset steps", "batch_at at hostile steps (bool, float, str, -1, 2**62, 2**63, 10**30, ...): the same clear error for one dataset and a mixture, or rows of the data; schedule pieces at unreachable or non-integer steps", mixture_steps),
    Attack("hostile mixture spec files", "deep nesting (JSON, TOML), 2 MB file, schedule steps 2**70 / true / 1.5, NaN weight, wrong shapes", spec_files),
    Attack("bucketed batches, long documents", "max_tokens batches at 1-3 ranks: served rows plus the counted left-out rows equal every piece of every document (tarfile + msgpack) exactly once", bucketed_tokens),
    Attack("node cache files and identity", "cached blocks copied over, swapped with or bit-flipped into one another, read with `checksums=False`; two datasets differing only by the URL's query string in one cache folder", cache_files),
    Attack("lying HTTP servers", "another shard's bytes (checksums on/off, cached or not), a short body then silence (always / once), a trickle of the shards: clear error within the documented time, or the right data", lying_servers),
    Attack("shards opened by URL", "a best-fit pack read by brace pattern, glob and list: targets equal the root's (padding masked); a stray shard, one of another pack, folders with and without index.json: refused", shard_url_openings),
    Attack("short last sample, shuffled", "every row of 2 shuffled epochs a whole packed sample (global and streams orders)", shuffled_short_sample),
    Attack("quarantined rows", "`on_corrupt='mask'`, 0 and 2 workers, rows across samples: 1 random bit in a sample, anywhere in a .tar or in a sidecar, or a .tar cut at a random byte; handled = every row the clean run's, or masked whole (input_ids 0, labels -100) and recorded naming a sample it holds", quarantined_rows),
    Attack("hostile chat records", "`pack --chat --mode docs`: one hostile line (wrong types, no role/content, unknown role, empty or string messages, surrogate, 100k-deep field, malformed ShareGPT and prompt/completion, content parts, no assistant turn, empty contents, 1 MB content) among 10 conversations, strict and --on-error skip; oracle: transformers' apply_chat_template ids and assistant masks; a conversation it refuses must be refused (file:line) or counted, every other stored exactly", chat_records),
    Attack("hostile chat templates", "the same with a hostile --chat-template: syntax error, raise_exception (always / on a system message), sandbox escapes (`__mro__`, `__globals__`, `namespace(_x=1)`), a macro calling itself, range(10**9), 1/0, nothing rendered, no assistant turn, `'x' * 10**8`, 100,000 x 100,000 loops writing or silent; then Qwen3-style reasoning that rewrites earlier turns (layout oracle + tiktoken)", chat_templates),
    Attack("hostile pre-tokenized records", "`--pretokenized --mask-key --mode docs`: one hostile line (ids out of range, negative, 2**64, 5000 digits, floats, NaN, booleans, strings, nested, ragged; masks short, 2, -1, 0.5, a string, null, missing, all 0; empty ids; 2M ids) among 10, strict and --on-error skip; oracle: the records' own ids and masks, decoded with tarfile + msgpack", masked_records),
    Attack("damaged Parquet / Arrow inputs", "Parquet with page CRCs, without, and Arrow IPC: 1 random bit flipped or cut at a random byte; columns of ints, nulls, lists, bytes, structs, none named text; JSON, empty and zero files named .parquet/.arrow; --on-error skip; oracle: pyarrow's own read of the same bytes as JSON Lines, packed (unreadable to pyarrow: must fail naming the file)", arrow_inputs),
    Attack("Python writer", "`pack_records` and `Writer` whose records raise the caller's exception at record 0, 37, 150 (it must come back, no index.json, then the same records resume byte-identical); a process writing through `Writer` SIGKILLed after 1/3/5 committed shards, rerun; 11 objects that are no records (object(), None, bytes, a set, ...) written among 20 texts, strict and skip; oracle: `pack_records` of the good records uninterrupted", python_writer),
    Attack("hostile states: identity, skips, counts", "a state after 5 batches, 2 skipped steps and 3 batches (global order; `quarantined: 3` and its seal), and a streams state: `config.dataset` replaced, its fields retyped, a hex digit changed, cut, upper-cased, removed or added to; `skips`, `quarantined`, `order_version`, `next_rows` retyped, out of range, reordered or removed; each with the seal (`check`) kept and removed; a StateMismatchError naming the key, or the uninterrupted run's next batches and (global) its training-to-data step mapping", hostile_states),
    Attack("bit 31 (loss mask) flipped in a chat pack", "a best-fit `pack --chat`: the mask bit of 1 random stored token flipped, the epoch read (input_ids and labels): the sample's CRC32C must refuse it", chat_mask_flips),
    Attack("chat templates writing other messages into answers", "`pack --chat` of marked conversations (every message holds a marker of its role and place) through templates that recap the user (whole, cut, upper-cased) or an earlier answer inside an answer, write the system prompt as a footer or inside each answer, repeat the last user message at the end, or recap outside `{% generation %}`; honest ChatML, generation tags and reasoning-dropping templates beside them; strict and --on-error skip; oracle: each supervised run decoded with tiktoken holds at most one marker, an assistant's, lone answers are kept, the rest stored or counted", foreign_answers),
    Attack("special-token text in chat messages", "conversations whose messages (system, user, answers, tool calls, tool results) spell out special tokens: cl100k, a ChatML tokenizer (`<|im_end|>` spelled among the markup's own), and `--special-tokens-in-content parse`; oracle: tiktoken's encode_ordinary of the layout's text, tokenizers' text encoding of the pieces between the markup's tokens, transformers' ids; `special_text` counts the conversations", spelled_specials),
    Attack("chat template bombs: time and memory", "24 templates that loop 10**10 times (nested, filtered, recursive loops, a macro calling itself twice), sort 100,000 items, search or slice 16 M characters at each of 100,000 loop items, or build 10**8-10**9 characters (`*`, `**`, `~`, `+`, `%`, format, center, ljust, replace, join, indent, lipsum, to_bytes, a namespace grown in a loop, a block body, a 16 M-word split); oracle: refused naming file:line and the template within the time limit, the pack's peak RSS under 1 GiB", template_bombs),
    Attack("stored loss mask against document ends", "masked pre-tokenized best-fit and concat packs whose documents hold the EOS id with the next token supervised, read at 0 and 2 workers with `mask_doc_ends` None / True / False; oracle: every row's labels from the stored bit 31 (tarfile + msgpack), FORMAT.md's rule", stored_mask_targets),
    Attack("ids that are not tokens", "index.json of a masked pack with `loss_mask` deleted or null, `bos_id` >= n_vocab or 2**31, `n_vocab` cut below the ids, alone and as a mixture source; `pack --bos-id` 2**31, 2**32, 2**64, -1, n_vocab; pre-tokenized ids null, 2**64-1, 2**63, -5, 1.0, true, \"7\", [1], n_vocab, strict and --on-error skip; oracle: no delivered id outside [0, n_vocab), the records' own ids decoded with tarfile + msgpack", token_ids),
    Attack("missing sidecars", "a format-v2 dataset with one shard's `.idx` deleted (and half the time a token byte of that shard flipped), 0 and 2 workers, token and document windows, default and `on_corrupt='mask'`; oracle: the clean run (masked rows whole and recorded), never an unchecked read", missing_sidecars),
    Attack("state downgrades", "global and mixture states after 4 batches, 2 skipped steps and 2 batches: `skips` kept, edited (6 ways) or removed, `quarantined` added, each with `check` kept, removed or cut back to the placing fields' tags; oracle: the uninterrupted run's next batches and training-to-data step mapping", state_downgrades),
    Attack("mixture specs naming or reading nothing", "a source named '' or ' ', a static weight of 0, 0.0 or -0.0, in code and as a spec file read by `wdstream explain`; a 0 inside a schedule piece (legal: that source left out of the piece)", spec_names_and_weights),
    Attack("shard table: bit flips", "1 random bit of `index.shards` (half within the header, prefix and counts), left alone, with index.json's commitment updated, and with its CRC32C recomputed too; small and large (> 64 KiB) index.json, names by rule and listed; Loader and `verify`; oracle: the clean rows, and for verify a struct decode of the table against the JSON list", table_flips),
    Attack("shard table: forged headers, names and rows", "tables with a valid CRC32C, committed to by index.json, whose n, prefix length, names length, flags, version or magic lie, whose prefix or listed names leave the root or hold NUL/non-UTF-8/duplicates, whose name offsets run backwards or past the end, whose rows break index.json's rules, cut or extended; small and large; Loader and `verify`", table_lies),
    Attack("shard table: the commitment", "index.json's `shard_table` missing, null, retyped (bool, float, string bytes), resized, upper-case or changed sha256, renamed, or another dataset's table and commitment put in; small and large; Loader and `verify`", commitments),
    Attack("large index.json: head and list", "index.json edited as text: keys repeated or moved after the list, NaN/Infinity/41 digits/100,000-deep nesting in the head, `shards` inside strings, 100 KB heads, a BOM, non-UTF-8, sorted keys; the list made to disagree with the table; a FIFO, a directory or /dev/zero as index.shards, a table not committed to; small and large; Loader and `verify` (oracle: json + struct)", head_edits),
    Attack("node cache: tables and sidecars", "a remote (HTTP) dataset read with cache_dir after its cached `tables/SHA.shards` or `objects/SHA256` was replaced by garbage, cut, emptied, another dataset's, a FIFO or a directory; 4 processes opening one cold cache at once; without a cache_dir, a table cut, removed or another dataset's; oracle: the clean rows", cache_tables),
    Attack("shard table: spawned workers re-map", "a Loader with 2 spawned workers, index.shards replaced (same size, valid CRC32C: two listed names swapped) after the parent opened it; oracle: the clean rows", worker_remap),
    Attack("Arrow inputs cut short or ambiguous", "an IPC stream cut at each message boundary, inside a message, or two streams concatenated; an IPC file cut in its footer; a column (or struct field) named twice, Parquet and IPC; a 3 MB row under --max-record-bytes 1MiB, strict and skip; oracle: pyarrow's own read (a cut stream reads as fewer rows than written: packing them is loss), the JSON Lines of its read less the long row", arrow_edges),
    Attack("Python writer: arguments and bounds", "`Writer` and `pack_records` with an output of None, 5, '' or bytes, a text_key of 5/None/'', a source of 5/None, a seq_len of 2**40, 2**31-1, 0, -1, True, 2.5, mask_key equal to ids_key: a TypeError/ValueError naming the argument before anything is written; a 3 MB text (ASCII, 2 MB of é, in a dict) under max_record_bytes 1MiB: refused naming `<records>:11`, or skipped and the rest equal to `pack_records` of the good texts", writer_edges),
    Attack("checkpoint states that are no state", "a Hugging Face checkpoint's `wdstream_loader_state.json` and a DCP `LoaderState` tensor holding null, 5, NaN, [1], NaN/-Infinity inside, non-UTF-8, not JSON, 60 KB of nesting (closed or not), 40 levels in an object: a StateMismatchError naming the file / key, never a traceback", state_edges),
    Attack("reader options and --plot paths", "`explain` with --seq-len 0/-1, --shuffle-window 0, --shuffle-lanes 0, --batch-size 0, --seed -1, --world-size 0 (oracle: the Loader refuses each value); `stats --plot` at index.json, a shard, a sidecar, the mixture spec, a symlink to a file or to index.json, with and without --overwrite-plot, and at a text file outside datasets: refused and every file's bytes unchanged (asked, the text file becomes a PNG)", option_edges),
    Attack("blank-line bombs and all-corrupt data", "a few KB of .zst holding 256 MiB of newlines, CRLFs or spaces and tabs (JSON Lines, .txt --lines): the clear error within the time limit; blank lines of every kind among records: the records' pack; every sample (every other sample) of a dataset corrupt, read with on_corrupt='mask' and no max_quarantined: QuarantineLimitError at the default limit (16 rows here), not an epoch of masked rows", bound_edges),
    Attack("chat template variables against transformers", "`pack --chat --chat-template-kwargs` of 27 kwargs (bos_token/eos_token shadowed by another special token, text, '', null, a number; non-ASCII, NUL, a lone surrogate; template markup and special-token text as values; nested order, 0 / -0.0 for false; template globals shadowed; names '', 'a-b', NFC/NFD; 600-deep and 96 KB values; loop bounds 10**10 and 2**70; 50,000-deep; render arguments) through a template reading them, strict and --on-error skip; oracle: transformers' apply_chat_template(**kwargs) ids and assistant masks (tarfile + msgpack), bombs refused or counted, render arguments and too-deep values refused naming the option", template_kwargs),
    Attack("chat template variables on resume", "a pack interrupted after 2 shards, resumed with the same kwargs, names reordered, 0 / 0.0 for false, a nested object reordered, 1.0 for 1, a name added or removed, none, an NFD name; oracle: refused (WdstreamError) or byte-identical to the uninterrupted pack with the resume's kwargs", kwargs_resumes),
    Attack("tokenizer paths that travel", "a chat pack with a relative --tokenizer, then explain --text and inspect from another folder after: nothing; tokenizer.json / tokenizer_config.json changed, swapped, removed or a FIFO; the folder a symlink to another or moved (--tokenizer to it, to a symlink to it); --tokenizer another tokenizer, a FIFO .json/.tiktoken/.model, /dev/zero, a 4 GiB sparse file, an empty folder, missing, o200k_base; stats.pack_cwd relative, '..', missing, a file, a FIFO, 5000 characters, surrogates, NUL, a number, another pack's folder; ranks_sha256 / config_sha256 not hex, upper-case, short, retyped, another file's; oracle: hashlib over the files read: exit 0 only with the recorded tokenizer and the output printed from the pack's folder, else one Error line", tokenizer_paths),
    Attack("recorded template variables", "index.json's stats.chat.template_kwargs replaced by a list, a string, null, a number, a render argument, NaN, 900- and 100,000-deep nesting, a loop bound of 10**10, true for false, a short and a 2 MB value the template writes; explain --text from the pack's folder; oracle: one Error line, every changed piece 'turns unknown (why)', or the clean index's explanation", recorded_kwargs),
    Attack("tokenizer paths: a tiktoken dataset given --tokenizer", "explain --text and inspect of a cl100k_base pack with --tokenizer cl100k_base, cl100k's ranks as a .tiktoken file, those ranks with two ids swapped, o200k_base, a Hugging Face folder, a FIFO .tiktoken, an unknown name; oracle: the output without --tokenizer when the ranks are cl100k's (canonical ranks sha256), else one Error line", tiktoken_given),
    Attack("held-out split: pack killed, rerun", "`pack --holdout 0.25` (concat, docs, best-fit; exact duplicates) SIGKILLed at each commit step (before/after the held-out index.json, before/after the training journal's removal) and after 1 or 3 shards of either dataset; the same command again (then --overwrite where it is refused as complete): oracle: both datasets byte-identical to the uninterrupted pack, and (docs) every stored document on its side of blake2b-64 < F * 2**64 computed here, none in both", holdout_kills),
    Attack("held-out split: leftovers at OUTPUT/holdout", "a file, a FIFO, a symlink to another dataset's held-out folder, another pack's held-out dataset (another fraction, --bos; complete or killed), a dataset of its own named holdout; packs with and without --holdout, with and without --overwrite: a clear error naming it, or the pair equal to the uninterrupted pack; a symlink's target never changed, no --holdout leaves a non-held-out dataset alone", holdout_leftovers),
    Attack("held-out split: fractions", "`pack(holdout=F)` and `Writer(holdout=F)` for F in 0, 1, -0.0, 1e-300, 5e-324, 0.999999, 1-2**-53, NaN, ±inf, '0.01', True, False, numpy floats, Fraction, Decimal, 2**64, [0.25], 0.5: refused naming holdout (or no/every document held out), else every document on its side by the rule computed here", holdout_fractions),
    Attack("held-out split: HTTP output failing a PUT", "`pack --holdout` to an HTTP server (PUT) that cannot store holdout/index.json, index.json or holdout/index.shards: a clear error and no training index.json; fixed, the rerun equals the local pack byte for byte, no lock left", holdout_remote),
    Attack("held-out split: readers", "Loader at OUTPUT and OUTPUT/*.tar reads exactly the training dataset alone (never holdout/ shards); a mixture of both reads rows of either; verify/stats/inspect/explain on both sides", holdout_readers),
    Attack("shard size from input size", "stats.shard_bytes against the rule computed from os.path.getsize (plain, gzip, a glob of 3.2 MB + tiny + empty files, the held-out share); an empty input; a pack killed after its first shard whose input then grew, was cut or edited in place: refused, then restored: the uninterrupted bytes", shard_sizing),
]  # fmt: skip
