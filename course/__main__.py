"""`python -m course COMMAND ...`: the course machinery from one command line.

    run NB...        execute notebooks in full mode (SEQ_FAST=1: fast), storing outputs and results
    check | sync     Colab badges and setup cells against REPO_URL (course.notebooks)
    results          rewrite the README results tables; `results --reads` checks recorded reads
    meta STEP        generated notebook structure: apply, check, solutions, slides, site, runtime, kernel
    student          write the student edition (solutions blanked) to build/student/
    site build|serve the website and slide decks, offline (course.site)
"""

import sys


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "check"
    if command in ("-h", "--help", "help"):
        print("usage: python -m course COMMAND [ARGS ...]  (COMMAND --help for each)\n" + __doc__)
        return 0
    if command == "results":
        from course.results import main as results_main

        return results_main(argv[1:])
    if command == "site":
        from course.site import main as site_main

        return site_main(argv[1:])
    if command in ("meta", "student"):
        from course.notebook_meta import main as meta_main

        return meta_main(argv[1:] if command == "meta" else argv)
    from course.notebooks import main as notebooks_main

    return notebooks_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
