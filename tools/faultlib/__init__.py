"""The attacks of ``tools/faults.py``; see that file for how to run it.

Shared: ``common`` (outcomes, the clean dataset, the CLI run, the input corpus), ``runner``
(each attempt in a forked child with a time limit), ``report`` (``docs/RELIABILITY.md``),
``attacks`` (the table, in the report's order). One module per surface attacked: ``flips``
(bit flips, index.json edits), ``cursors`` (hostile saved states), ``inputs`` (hostile pack
inputs), ``storage``, ``packs`` (the pack process killed or failing), ``servers`` (hostile
and lying HTTP servers, the node cache), ``rows`` (rows as served), ``mixture``,
``quarantine``, ``reasoning`` (chat templates that rewrite earlier turns, a template's own
EOS), ``edges`` (Arrow inputs cut short, the writer's arguments and bounds, checkpoint
states, reader options and ``--plot`` paths, blank-line bombs, all-corrupt data),
``travel`` (chat template variables against transformers and on resume, tokenizer paths
found again from ``pack_cwd`` or given, recorded template variables), ``holdout`` (``pack
--holdout`` killed at every commit step and in either dataset's shards, leftovers at
``OUTPUT/holdout``), ``holdout_edges`` (hostile fractions, an HTTP output failing a PUT,
readers of the pair, the shard size chosen from the input's size), ``first_step`` (the
first step a Loader with workers makes in its training process: corrupt samples it reads,
calls between the first and second batch, an HTTP store failing during it), ``worker_errors``
(a torch worker failing: corrupt bytes, a missing shard, SIGKILL, ^C; the workers' end and
the next ``iter()``), ``worker_shards`` (a pack whose shards the token pool's workers build:
kills, ^C, a full ``/dev/shm`` or disk; the rerun against the usual pipeline's bytes),
``changing_inputs`` (input files appended to, cut, rewritten, renamed over or deleted while
packed or between a kill and the rerun; every format and pipeline, the Ray engine),
``journal_command`` (the pack journal's command object: kills around it, hostile states),
``s3_lies`` (an S3 endpoint that lies: a proxy in front of moto rewriting reads, listings
and writes), ``local_storage`` (the node cache and the workers' piece exchange on a full,
read-only or cleared disk, their files cut short while read; ``local_storage_driver`` runs
each attempt).
"""
