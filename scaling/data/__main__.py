"""``python -m scaling.data``: build a token cache once, or inspect the data pipeline (corpus statistics, the
hash of one training batch). The options are ``DataConfig``'s fields; the pipeline is ``scaling.data.pipeline``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing

from scaling import cli
from scaling.config import DataConfig, from_dict
from scaling.data import pipeline as data, token_cache
from scaling.store import storage


def _config_from_args(args) -> DataConfig:
    given = {name: getattr(args, name) for name in DataConfig.__pydantic_fields__
             if getattr(args, name, None) is not None}
    return from_dict(DataConfig, given)  # validation turns the option strings into the fields' types


def _data_options() -> argparse.ArgumentParser:
    """``DataConfig``'s fields as options (``seq_len`` -> ``--seq-len``), built from the
    dataclass: a field's description is its help, a ``Literal`` type its choices."""
    data = cli.Parser(add_help=False)
    group = data.add_argument_group("data config (an option left out keeps the default shown)")
    for name, field in DataConfig.__pydantic_fields__.items():
        literal = typing.get_origin(field.annotation) is typing.Literal
        group.add_argument("--" + name.replace("_", "-"), dest=name,
                           choices=typing.get_args(field.annotation) if literal else None,
                           nargs="+" if isinstance(field.default, tuple) else None,
                           help=f"{field.description} (default {field.default!r})")
    return data


def _parser() -> argparse.ArgumentParser:
    data = _data_options()
    parser = cli.Parser(
        prog=cli.prog("python -m scaling.data"),
        description="Build a token cache once (cache), or inspect the data pipeline: corpus statistics, "
                    "or the hash of one training batch (to check that two machines, a restarted run or a "
                    "run reading a cache see the same data).")
    commands = parser.add_subparsers(dest="command", required=True)
    cache = commands.add_parser(
        "cache", parents=[data], help="tokenise a text source once into --cache-dir (resumable)",
        description="Read, split and tokenise a text source into --cache-dir (local or gs://), shard by "
                    "shard; run it again after an interruption to resume. Then train with "
                    "data.cache_dir set to the same directory: runs read only the cache.")
    cache.add_argument("--shard-documents", dest="shard_documents", type=int,
                       default=token_cache.DEFAULT_SHARD_DOCUMENTS, help="documents per token shard (default "
                       f"{token_cache.DEFAULT_SHARD_DOCUMENTS:,}); a resumed build must use the same number")
    cache.add_argument("--quiet", action="store_true", help="no progress bars")
    stats_help = "fingerprint, vocabulary and (text sources) train/validation sizes"
    stats = commands.add_parser("stats", parents=[data], help=stats_help, description=stats_help)
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    digest_help = "SHA-256 of the inputs (int32) of one global training batch"
    digest = commands.add_parser("batch-hash", parents=[data], help=digest_help, description=digest_help)
    digest.add_argument("--seed", type=int, required=True, help="data-order seed")
    digest.add_argument("--step", type=int, required=True, help="optimizer step")
    digest.add_argument("--batch-size", dest="batch_size", type=int, required=True,
                        help="global batch size in sequences")
    return parser


def main(argv=None) -> None:
    """Entry point of ``python -m scaling.data``."""
    from scaling.entry import prepare_process

    prepare_process()  # before JAX starts its backend or a storage client
    args = _parser().parse_args(argv)
    try:
        config = _config_from_args(args)
        storage.check_access(args.cache_dir)  # a gs:// cache's bucket: one line (StorageAccessError) if unusable
        if args.command == "cache":
            if not args.cache_dir:
                raise ValueError("cache needs --cache-dir DIR (a local path or gs://BUCKET/...)")
            directory = token_cache.build_cache(dataclasses.replace(config, cache_dir=""), args.cache_dir,
                                                args.shard_documents, show_progress=not args.quiet)
            opened = token_cache.open_cache(directory, config)
            print(f"token cache {args.cache_dir}: {len(opened.train):,} train and {len(opened.validation):,} "
                  f"validation tokens, fingerprint {opened.fingerprint}; "
                  f"train with --set data.cache_dir={args.cache_dir}")
        elif args.command == "stats":
            stats = data.build(config).stats
            print(json.dumps(stats) if args.json else "\n".join(f"{k:22s}{v}" for k, v in stats.items()))
        else:
            print(data.batch_digest(data.build(config).train_batch(args.seed, args.step, args.batch_size)))
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
