"""`python -m archsearch`: the same CLI as the `archsearch` console script."""

from archsearch.cli import main

main()
