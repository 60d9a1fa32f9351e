"""Publish a trained head on the Hugging Face Hub: its `PUBLISHED` files, the card rendered afresh, nothing else."""
from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import sys
import tempfile
from pathlib import Path

from huggingface_hub import HfApi

from specdecpp.checks import read_head_config
from specdecpp.cli import input_errors
from specdecpp.head.folder import write_head_files
from specdecpp.models import load_head

PUBLISHED = ("config.json", "model.safetensors", "pytorch_model.bin", "card.json", "recipe.yaml", "calibration*.json",
             "*.png")


def published_files(head_dir: str | os.PathLike) -> list[str]:
    """The files of `head_dir` published besides `custom_generate/` and the card (rendered afresh), sorted."""
    names = [p.name for p in Path(head_dir).iterdir() if p.is_file()]
    return sorted(n for n in names if any(fnmatch.fnmatch(n, pattern) for pattern in PUBLISHED))


def stage_head(head_dir: str | os.PathLike, staging: str | os.PathLike, repo_id: str | None = None) -> list[str]:
    """Stage what is published from `head_dir` in `staging`; the staged paths, sorted (ValueError: not a head)."""
    head_dir, staging = Path(head_dir), Path(staging)
    if not head_dir.is_dir():
        raise FileNotFoundError(f"no head folder at {head_dir}")
    load_head(str(head_dir))
    for name in published_files(head_dir):
        shutil.copy2(head_dir / name, staging / name)
    write_head_files(staging, repo_id)
    return sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())


def push_head(head_dir: str | os.PathLike, repo_id: str, *, private: bool = False, token: str | None = None,
              revision: str | None = None, commit_message: str = "Upload SpecDec++ acceptance prediction head"):
    """Publish the head in `head_dir` as the Hub model repo `repo_id`; returns the upload's `CommitInfo`."""
    read_head_config(os.fspath(head_dir))  # before creating a repo
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model").repo_id
    with tempfile.TemporaryDirectory() as staging:
        stage_head(head_dir, staging, repo_id)
        return api.upload_folder(repo_id=repo_id, folder_path=staging, commit_message=commit_message,
                                 revision=revision, repo_type="model")


def main(argv: list[str] | None = None) -> None:
    """Command line: `specdecpp push HEAD REPO_ID [--private] [--token T] [--revision R] [--dry_run]`."""
    parser = argparse.ArgumentParser(prog="specdecpp push", description=__doc__.split("\n\n")[0])
    parser.add_argument("head", help="a head folder (train's --output or a checkpoint-* folder)")
    parser.add_argument("repo_id", help="the Hub model repo, e.g. you/acchead-smollm2-135m-1.7b")
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--token", default=None, help="a Hub token (default: the logged-in one)")
    parser.add_argument("--revision", default=None, help="the branch to commit to (default: main)")
    parser.add_argument("--dry_run", action="store_true", help="list the files that would be published, upload nothing")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    with input_errors("push"):
        if args.dry_run:
            with tempfile.TemporaryDirectory() as staging:
                print("\n".join(stage_head(args.head, staging, args.repo_id)))
            return
        commit = push_head(args.head, args.repo_id, private=args.private, token=args.token, revision=args.revision)
    print(f"published {args.head} to {getattr(commit, 'commit_url', None) or args.repo_id}")


if __name__ == "__main__":
    main()
