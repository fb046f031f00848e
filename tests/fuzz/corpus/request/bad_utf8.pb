
ÿþ fox@