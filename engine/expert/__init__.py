"""The expert's hand: verdicts on the pool (`review`), gate verdicts in plain words (`explain`), the dev rows the
labels get wrong and rows like them (`rows`), and the rows worth a label next (`queue`)."""
