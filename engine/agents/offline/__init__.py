"""The offline proposer: the three roles as program synthesis from the data, with no LLM. `proposer` plays them;
`cues` counts which words point to which class, `candidates` turns those counts into annotators, `roles` says what
each role mines, `task_words` reads cues from the task's own words, `word_sense` widens them with MiniLM, and
`selection` previews the gate to choose what to propose."""
