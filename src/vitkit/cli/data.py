"""``vitkit data fetch fashion-mnist``: a dataset into the user's data folder, checked, no root needed."""
from __future__ import annotations

from ._util import add_command, nonneg_int, positive_float


def register(sub) -> None:
    from ..data.fetch import DATASETS, FASHION_MNIST_URL

    p = add_command(sub, "data", help="""
        fetch a dataset into your data folder (Fashion-MNIST: no root, no Debian package needed)""", description="""
        Download Fashion-MNIST's four IDX files into the user's data folder ($VITKIT_DATA_DIR, else
        $XDG_CACHE_HOME/vitkit/data, i.e. ~/.cache/vitkit/data), where --data fashion-mnist finds them after
        Debian's /usr/share/datasets/fashion-mnist. Each file is checked against its SHA-256 before it is renamed
        into place; an interrupted download resumes on the next run; files already there are checked, not
        fetched again.""")
    p.add_argument("action", choices=["fetch"], help="what to do (fetch: download and check)")
    p.add_argument("dataset", choices=DATASETS, help="the dataset")
    p.add_argument("--dir", metavar="DIR", default=None,
                   help="the folder to put the files in (default: DATA_DIR/fashion-mnist, see above)")
    p.add_argument("--base-url", metavar="URL", default=FASHION_MNIST_URL,
                   help=f"where the files are, a folder URL (default {FASHION_MNIST_URL}, Zalando's); a mirror "
                        f"must serve the same bytes")
    p.add_argument("--retries", type=nonneg_int, default=3, help="retries of a failed connection (default 3)")
    p.add_argument("--timeout", type=positive_float, default=60.0, help="seconds a connection may stall (default 60)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_fetch)


def _fetch(args) -> int:
    from ..data.fetch import FASHION_MNIST_SHA256, fetch_fashion_mnist

    folder = fetch_fashion_mnist(args.dir, base_url=args.base_url, progress=not args.no_progress,
                                 retries=args.retries, timeout=args.timeout)
    use = f"--data fashion-mnist:{folder}" if args.dir else "--data fashion-mnist"
    print(f"Fashion-MNIST: {len(FASHION_MNIST_SHA256)} files in {folder}, SHA-256 checked; train with {use}")
    return 0
