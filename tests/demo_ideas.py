"""Annotator ideas scripted against the bundled demo (data/demo/youtube_spam.csv) for more than one test."""

# the demo's offline pool holds "SPAM: caps_share >= 0.1" after two generations; this votes wherever it does, and
# on "check out" too, more precisely over all its fires, so the gate takes it and prunes that member
WIDER_CAPS = (
    "def annotate(example):\n    text = str(example.get('text') or '')\n"
    "    letters = [ch for ch in text if ch.isalpha()]\n"
    "    caps = round(sum(ch.isupper() for ch in letters) / len(letters), 2) if len(letters) >= 8 else 0.0\n"
    "    if caps >= 0.1 or 'check out' in text.lower():\n        return 'SPAM'\n    return None\n")
