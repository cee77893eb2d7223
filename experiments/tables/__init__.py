"""The table generators: each module renders one kind of record (sweep runs, LRA and UEA records, spectra, the
benchmarks' JSON) as Markdown; `experiments.docs_tables` places them in README.md and docs/*.md, and the
benchmarks write their own `.md` records with the same functions."""
