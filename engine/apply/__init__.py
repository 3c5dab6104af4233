"""Applying a pool: annotators turned into votes. The compiled path runs the offline templates in-process on
column scans (`compiled`, `word_index`); everything else goes to the OS-confined sandbox (`executor`); `votes`
fills the store with what is missing."""
