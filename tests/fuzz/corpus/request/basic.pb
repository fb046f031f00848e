
a red fox in fresh snow@0 H