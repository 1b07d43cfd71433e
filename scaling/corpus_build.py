"""``python -m scaling.corpus_build``: the command line, kept under its name
(the module is ``scaling.data.corpus_build``)."""

if __name__ == "__main__":
    from scaling.corpus import build_main

    build_main(prog="python -m scaling.corpus_build")
